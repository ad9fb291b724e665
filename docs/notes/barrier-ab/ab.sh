#!/bin/bash
# A/B: main vs barrier tree, FFN W3,W4 and quantizer W3, alternating processes.
PY=/work/main/.venv/bin/python
for i in 1 2; do
 for t in main barrier-tree; do
  cd /work/$t
  $PY -m s3r.cli bench ffn --shapes W2,W3,W4 --recipes bf16,int8_rtne,s3r,s3r_ec_dx --repeats 7 --out-dir /tmp/ab/$t-ffn-$i --no-chart > /tmp/ab/$t-ffn-$i.log 2>&1
  $PY -m s3r.cli bench quantizer --shapes W2,W3,W4 --recipes int8_rtne,s3r,s3r_ec_dx --repeats 9 --out-dir /tmp/ab/$t-q-$i --no-chart > /tmp/ab/$t-q-$i.log 2>&1
 done
done
echo done
