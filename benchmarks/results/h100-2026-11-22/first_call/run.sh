# On the GPU machine, after the five parts are in /tmp/dali-parts: install DALI, make the built-in data,
# run the gpu tests, the doctor and dali-pipes profile. At most 8 files come back: logs go to one file.
L=$OUT/log.txt
mkdir -p /tmp/dali-wheels && cat /tmp/dali-parts/part-* | tar -x -C /tmp/dali-wheels
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/dali-wheels/*.whl .device-wheels/extra/*.whl >> $L 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH
{ echo "== machine"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc;
  python3 -c "import sys, torch, nvidia.dali; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'dali', nvidia.dali.__version__)"; } >> $L 2>&1
echo "== sample" >> $L; python3 -m dali_pipes.cli sample data/sample/images >> $L 2>&1
echo "== gpu tests" >> $L; timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_graph_check.py tests/test_loader.py 2>&1 | tail -30 >> $L
echo "== doctor" >> $L; timeout 240 python3 -m dali_pipes.doctor --quick --out /tmp/doctor >> $L 2>&1
cp /tmp/doctor/doctor.json /tmp/doctor/doctor.md /tmp/doctor/throughput.json $OUT/ 2>>$L
echo "== profile" >> $L; timeout 150 python3 -m dali_pipes.cli profile --rounds 2 --batches 8 --out /tmp/profile >> $L 2>&1
cp /tmp/profile/profile.json /tmp/profile/profile.md $OUT/ 2>>$L
echo "== done" >> $L
