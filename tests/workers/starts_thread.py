"""A module that starts a thread when it is imported: forking a process that
has imported it is unsafe, which `--preload` must detect."""
import threading
import time

threading.Thread(target=time.sleep, args=(600,), daemon=True, name="importer").start()
