"""The host agent: one per host per run. It starts every task of its host, watches them, and makes
sure that everything a task started ends with it. Standard library only, Python 3.6 syntax, and
nothing of the launcher's: it runs on hosts that have only a Python.

Its modules, each importing only the ones above it:

- :mod:`.protocol`: every fact of the protocol between tflaunch and the agent (frames, commands,
  statuses, the fields encoding, the connect-back handshake); tflaunch imports it from here;
- :mod:`.trees`: process trees from /proc (children, descendants, a task's mark, signals);
- :mod:`.gpus`: the GPUs of watched tasks, read through NVML on a thread of its own;
- :mod:`.threads`: a watched task's threads, CPUs and GPUs, running totals for tflaunch's straggler rule;
- :mod:`.sampling`: each task's resource readings (and those totals), sent in one frame;
- :mod:`.ports`: ports picked, held and claimed against this user's other runs;
- :mod:`.channel`: the channel to tflaunch (stdin and stdout, or a connection back with its
  token) and the non-blocking descriptor calls;
- :mod:`.starting` and :mod:`.ending`: how the agent starts its processes, and how it ends them
  and what they left behind;
- :mod:`.loop`: the agent itself, its event loop and its entry point ``main``.

It is shipped as one source, the modules joined in that order with their imports of each other
taken out (:func:`launcher.transports.shipping.agent_source`), so no two modules may define the
same top-level name. tflaunch's side imports :mod:`.protocol`, and :mod:`.sampling` to read a
process of its own machine the way an agent does, never the others.
"""
