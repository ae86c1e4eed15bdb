"""The ports the suite's servers get: one per server across every process of the machine (AR-2).

Four pytest-xdist workers start hundreds of servers side by side. A port taken with bind(0)
and released was once taken again, by another worker, before the first server bound it: the
first test's health check then reached the other test's server and its token was refused.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from controlcenter.stack import PORT_RANGE, free_port

ROOT = Path(__file__).resolve().parents[2]

# Two processes with the same random state would scan the same ports in the same order.
CLAIM_WITH_SEED = """
import json, random, sys, time
from controlcenter import stack
random.seed(7)
ports = [stack.free_port() for _ in range(20)]
print(json.dumps(ports), flush=True)
sys.stdin.read()  # holds its claims until told to go
"""


def _claimer() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIM_WITH_SEED], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.req("AR-2")
def test_two_processes_scanning_the_same_ports_never_get_the_same_one():
    first, second = _claimer(), _claimer()
    try:
        ports = [json.loads(process.stdout.readline()) for process in (first, second)]
    finally:
        for process in (first, second):
            process.communicate("", timeout=30)
    assert len(set(ports[0])) == len(set(ports[1])) == 20
    assert not set(ports[0]) & set(ports[1]), "two processes were handed the same port"


@pytest.mark.req("AR-2")
def test_a_port_is_outside_the_range_the_kernel_hands_out_by_itself():
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert PORT_RANGE.stop <= low or PORT_RANGE.start > high
    port = free_port()
    assert low > port or port > high
    # bind(0) and outgoing connections draw from that range only.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert low <= sock.getsockname()[1] <= high


@pytest.mark.req("AR-2")
def test_a_port_in_use_is_never_handed_out():
    random.seed(11)
    start = random.randrange(len(PORT_RANGE))
    holders = []
    try:
        for step in range(10):  # the ten ports the scan below tries first
            sock = socket.socket()
            sock.bind(("127.0.0.1", PORT_RANGE[(start + step) % len(PORT_RANGE)]))
            sock.listen()
            holders.append(sock)
        random.seed(11)
        port = free_port()
        assert port not in {sock.getsockname()[1] for sock in holders}
    finally:
        for sock in holders:
            sock.close()
