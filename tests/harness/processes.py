"""Start real servers for tests: the gateway as `mqgw serve` runs it, on free loopback ports.

The launcher lives in bench/servers.py (the benchmark starts the same servers); every child
gets PR_SET_PDEATHSIG, so servers started for tests stop by themselves.
"""

from __future__ import annotations

from pathlib import Path

from bench.processes import check_for, die_with_parent
from bench.servers import GatewayServer as GatewayProcess

__all__ = ["REPO", "GatewayProcess", "check_for", "die_with_parent"]

REPO = Path(__file__).resolve().parents[2]
