"""Build the optional C accelerators of streamrec.format (and storage's local reads).

Every extension is optional: without a C compiler (or with STREAMREC_PURE_PYTHON=1 at build
time) streamrec installs and runs on its pure-Python fallbacks, which produce identical results.
"""

import os
import sys

from setuptools import Extension, setup

compile_args = [] if sys.platform == "win32" else ["-O3", "-std=c99"]
thread_args = [] if sys.platform == "win32" else ["-pthread"]
extensions = []
if not os.environ.get("STREAMREC_PURE_PYTHON"):
    extensions = [
        Extension(
            "streamrec.format._cframing",
            ["streamrec/format/_cframing.c"],
            extra_compile_args=compile_args,
            optional=True,
        ),
        Extension(
            "streamrec.storage._cread",
            ["streamrec/storage/_cread.c"],
            extra_compile_args=compile_args,
            optional=True,
        ),
        Extension(
            "streamrec.format._cexample",
            ["streamrec/format/_cexample.c"],
            extra_compile_args=compile_args + thread_args,  # parse_examples_arrow's threads
            extra_link_args=thread_args,
            optional=True,
        ),
    ]

setup(ext_modules=extensions)
