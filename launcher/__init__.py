"""tflaunch: launch, supervise and inspect TensorFlow distributed training clusters."""

__version__ = "0.1.0"

__all__ = ["LaunchInterrupted", "LaunchResult", "__version__", "launch", "run_record", "runs"]
_API = ("LaunchInterrupted", "LaunchResult", "launch", "run_record", "runs")


def __getattr__(name: str):
    # The Python API (launcher/api.py) loads on first use, so "import launcher" stays cheap.
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
