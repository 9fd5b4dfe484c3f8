"""One rank of ``ranks.run``: imports a test module by path, calls a function,
pickles what it returned."""

import importlib.util
import os
import pickle
import sys

module_file, name, args_file, out, ending = sys.argv[1:6]
spec = importlib.util.spec_from_file_location("rank_module", module_file)
assert spec is not None and spec.loader is not None
module = importlib.util.module_from_spec(spec)
sys.path.insert(0, os.path.dirname(module_file))
spec.loader.exec_module(module)
with open(args_file, "rb") as f:
    args = pickle.load(f)
value = getattr(module, name)(*args)
with open(out, "wb") as f:
    pickle.dump(value, f)
if ending == "hard":
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
