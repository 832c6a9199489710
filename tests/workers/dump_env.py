"""Writes this worker's environment to $RECORD_DIR/env_<rank>.json."""
import json
import os

with open(os.path.join(os.environ["RECORD_DIR"], f"env_{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(os.environ), f, sort_keys=True)
