#!/bin/sh
# A worker for the health-check test (run with --no-python): in the first
# attempt, node rank 0's worker marks the node "sick" for the health check
# ($SICK) and fails; later attempts log their world size and succeed.
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$GROUP_RANK" = 0 ]; then
    touch "$SICK"
    sleep 0.3
    exit 1
  fi
  sleep 60
fi
echo "world $WORLD_SIZE attempt $TORCHELASTIC_RESTART_COUNT" >> "$SICK.log"
