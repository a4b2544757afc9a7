"""WHALE's tests, one subfolder per package they test (CONTRIBUTING.md, "Tests"). A package, so that
test files are imported by their full name (``tests.train.test_trainer``): the same basename may stand
in two subfolders, ``tests/harnesses/`` never shadows the ``harnesses`` package, and a test that imports
another test file's helpers gets the module pytest imported, not a second copy."""
