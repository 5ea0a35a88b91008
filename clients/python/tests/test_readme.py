"""The README's "Python client" section works as written: its Python blocks run, in
order, against a real broker (at its own address instead of 127.0.0.1:7411)."""

import contextlib
import io
import os
import re
import unittest
import zlib

import support


def readme_blocks():
    with open(os.path.join(support.REPO_ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## Python client\n(.*?)^## ", text, re.S | re.M).group(1)
    return re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)


@support.needs_broker
class Readme(unittest.TestCase):
    def test_the_python_client_section_runs_as_written(self):
        blocks = readme_blocks()
        self.assertTrue(blocks, "no ```python block under '## Python client'")
        with support.Mortard() as broker:
            out = io.StringIO()
            scope = {}
            with contextlib.redirect_stdout(out):
                for block in blocks:
                    exec(compile(block.replace("127.0.0.1:7411", broker.address),
                                 "README.md", "exec"), scope)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "partition %d sequence 1" % (zlib.crc32(b"customer-42") % 4))
        self.assertEqual(len(lines), 1 + 1001 + 1 + 1, lines[-3:])
        self.assertTrue(lines[-2].startswith("UNKNOWN_TOPIC no - DECLARE the topic"), lines[-2])
        self.assertEqual(lines[-1], "b'cannot be done' jobs 1 REJECTED")


if __name__ == "__main__":
    unittest.main()
