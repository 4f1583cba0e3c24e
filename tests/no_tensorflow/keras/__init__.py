"""Stands in front of the real keras for the tasks of tests not marked tensorflow (tests/tiers.py): importing it fails."""

raise ImportError("keras in a test not marked tensorflow: TensorFlow runs only in tests marked tensorflow "
                  "(tests/tiers.py); mark the test or run the stand-in worker tests/workers/lockstep.py")
