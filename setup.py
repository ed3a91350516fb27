"""The optional C extension (``runner/handlers/_spawn*.c``); everything else is in
``pyproject.toml``. ``optional=True``: without a compiler the install goes on and flowrun
starts handlers through ``_posixsubprocess`` instead (``runner.handlers.spawn``)."""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "runner.handlers._spawn",
            [
                "runner/handlers/_spawn.c",
                "runner/handlers/_spawn_req.c",
                "runner/handlers/_spawn_pool.c",
                "runner/handlers/_spawn_child.c",
            ],
            depends=[
                "runner/handlers/_spawn_req.h",
                "runner/handlers/_spawn_pool.h",
                "runner/handlers/_spawn_child.h",
            ],
            # only PyInit__spawn exported: the flowrun_* functions between the files are not
            extra_compile_args=["-fvisibility=hidden"],
            optional=True,
        )
    )

setup(ext_modules=ext_modules)
