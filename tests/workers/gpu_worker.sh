#!/bin/sh
# A worker for the GPU-release test (run with --no-python): in the first
# attempt it registers itself with the fake nvidia-smi as a GPU process
# ($GPU_APPS) and fails; later attempts succeed.
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  echo $$ >> "$GPU_APPS"
  exit 1
fi
echo "attempt $TORCHELASTIC_RESTART_COUNT started $(date +%s.%N)" >> "$GPU_APPS.log"
