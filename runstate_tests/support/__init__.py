"""What the tests and bench/ share: plain helpers, no fixtures and no tests.

Test modules and benches import helpers from here, never from a test module or a conftest (pytest loads
those itself, and importing one runs its module-level setup a second time under another name).
runstate_tests/test_test_layout.py holds the suite to that.
"""
