"""What the tests share, one module per topic: tiny models and runs, the commands' runner, fake data and runs,
figure checks, file-system faults, hostile files. Test modules import from here (or use the fixtures of a
conftest.py), never from another test module (tests/test_test_layout.py holds that)."""
