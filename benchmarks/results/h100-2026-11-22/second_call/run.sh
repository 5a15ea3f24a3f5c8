# Second GPU call: the fixed gpu test, a longer profile, whole epochs on the GPU, a short training run with
# online tuning on a GPU graph. At most 8 files come back: logs go to one file.
L=$OUT/log.txt
mkdir -p /tmp/dali-wheels && cat /tmp/dali-parts/part-* | tar -x -C /tmp/dali-wheels
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/dali-wheels/*.whl .device-wheels/extra/*.whl >> $L 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH
echo "== sample" >> $L; python3 -m dali_pipes.cli sample data/sample/images >> $L 2>&1
echo "== gpu test" >> $L; timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_graph_check.py -k "agree" 2>&1 | tail -3 >> $L
echo "== profile" >> $L; timeout 200 python3 -m dali_pipes.cli profile --rounds 3 --batches 40 --warmup 4 --out /tmp/profile >> $L 2>&1
cp /tmp/profile/profile.json /tmp/profile/profile.md $OUT/ 2>>$L
echo "== epochs" >> $L; timeout 120 python3 -m dali_pipes_bench.epochs --device gpu --threads 8 --epochs 8 --step 0 0.02 --out $OUT/epochs_gpu.json >> $L 2>&1
echo "== train" >> $L; timeout 150 python3 -m train --arch resnet18 --epochs 2 --batch-size 16 --image-size 224 --workdir /tmp/run --trace /tmp/run/trace.json >> $L 2>&1
cp /tmp/run/metrics.jsonl $OUT/train_metrics.jsonl 2>>$L
echo "== done" >> $L
