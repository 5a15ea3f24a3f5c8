# Third GPU call: whole epochs on the GPU after the trim became rate-limited; a training run whose tuning
# starts from an empty memory (trials on a GPU graph), with its trace.
L=$OUT/log.txt
mkdir -p /tmp/dali-wheels && cat /tmp/dali-parts/part-* | tar -x -C /tmp/dali-wheels
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/dali-wheels/*.whl .device-wheels/extra/*.whl >> $L 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH
echo "== sample" >> $L; python3 -m dali_pipes.cli sample data/sample/images >> $L 2>&1
echo "== epochs" >> $L; timeout 200 python3 -m dali_pipes_bench.epochs --device gpu --threads 8 --epochs 16 --step 0 0.02 --out $OUT/epochs_gpu.json >> $L 2>&1
echo "== train" >> $L; DALI_PIPES_CACHE=/tmp/fresh timeout 200 python3 -m train --arch resnet18 --epochs 2 --batch-size 16 --image-size 224 --workdir /tmp/run --trace $OUT/trace.json >> $L 2>&1
cp /tmp/run/metrics.jsonl $OUT/train_metrics.jsonl 2>>$L
echo "== done" >> $L
