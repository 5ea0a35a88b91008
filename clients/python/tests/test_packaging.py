"""`pip install ./clients/python` into a fresh venv, offline (--no-index: the in-tree
build backend needs nothing from an index), then the installed copy is imported from
outside the repository."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

import support

CHECK = r"""
import importlib.metadata, os, sys
import mortarmq
from mortarmq import wire
assert os.path.realpath(mortarmq.__file__).startswith(os.path.realpath(sys.prefix)), mortarmq.__file__
assert importlib.metadata.version("mortarmq") == mortarmq.__version__
assert wire.decode_frame(wire.Ping().encode()) == wire.Ping()
assert mortarmq.MortarError(0x0008).name == "UNKNOWN_TOPIC"
print("ok")
"""


@unittest.skipUnless(importlib.util.find_spec("ensurepip"),
                     "this Python cannot make a venv with pip (no ensurepip)")
class PipInstall(unittest.TestCase):
    def test_pip_install_into_a_fresh_venv_offline(self):
        with tempfile.TemporaryDirectory(prefix="mortarmq-venv-") as tmp:
            venv = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            python = os.path.join(venv, "bin", "python")
            env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
            env.pop("PYTHONPATH", None)
            install = subprocess.run(
                [python, "-m", "pip", "install", "--no-index", support.PACKAGE_ROOT],
                env=env, capture_output=True, text=True)
            self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
            # From elsewhere, so the source tree is not what gets imported.
            run = subprocess.run([python, "-c", CHECK], cwd=tmp, env=env,
                                 capture_output=True, text=True)
            self.assertEqual(run.stdout.strip(), "ok", run.stdout + run.stderr)
        # pip builds in a copy: the source tree stays as it was.
        leftovers = [n for n in os.listdir(support.PACKAGE_ROOT)
                     if n.endswith((".egg-info", ".dist-info")) or n in ("build", "dist")]
        self.assertEqual(leftovers, [])


if __name__ == "__main__":
    unittest.main()
