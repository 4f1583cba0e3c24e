"""How the exposure check resolves a large cluster's names: a few at a time, every one of them."""

from __future__ import annotations

import threading

import pytest

from launcher.cluster.exposure import RESOLVE_TIMEOUT, RESOLVERS, public_addresses, resolve_timeout

pytestmark = pytest.mark.unit


def test_a_thousand_names_are_resolved_by_a_few_threads():
    lock = threading.Condition()
    busy, most, seen = 0, 0, []

    def resolver(name: str) -> list[str]:
        nonlocal busy, most
        with lock:
            busy += 1
            most = max(most, busy)
            seen.append(name)
            lock.notify_all()
            # The first lookups stay in progress a while, or until one more than the resolver
            # threads is in progress too: so they overlap wherever more could.
            if len(seen) <= RESOLVERS + 1:
                lock.wait_for(lambda: most > RESOLVERS, timeout=0.5)
            busy -= 1
        return ["8.8.8.8"] if name.endswith("7") else ["10.0.0.1"]

    names = [f"gpu{i}.example.org" for i in range(1000)] + ["10.1.2.3", "8.8.4.4"]
    threads_before = threading.active_count()
    found = public_addresses(names, resolver, timeout=60)
    assert sorted(seen) == sorted(names[:1000])  # the addresses themselves are not looked up
    assert most == RESOLVERS  # as many at once as there are resolver threads, never one per name
    assert threading.active_count() <= threads_before + RESOLVERS
    assert found == {**{n: ["8.8.8.8"] for n in names[:1000] if n.endswith("7")}, "8.8.4.4": ["8.8.4.4"]}


@pytest.mark.parametrize("value, seconds", [(None, RESOLVE_TIMEOUT), ("7.5", 7.5), ("0", 0.0), ("soon", RESOLVE_TIMEOUT),
                                            ("-1", RESOLVE_TIMEOUT), ("inf", RESOLVE_TIMEOUT), ("nan", RESOLVE_TIMEOUT)])
def test_the_lookups_wait_is_tflaunch_resolve_timeout_when_it_is_a_number_of_seconds(value, seconds):
    environ = {} if value is None else {"TFLAUNCH_RESOLVE_TIMEOUT": value}
    assert resolve_timeout(environ) == seconds
