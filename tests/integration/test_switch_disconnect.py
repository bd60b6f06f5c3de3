"""A switch whose connection ends is down at once, even if the controller has
nothing to send it: under os-ken's native hub a connection's end used to be
noticed only at the next message sent to that switch (`Datapath.serve` waits
for its send thread, which waits for something to send). A switch with no
ports gets no LLDP frame, so it stayed "connected" for good; at k=32, with an
LLDP round of about 100 s, a dropped switch stayed up for up to a round."""

from __future__ import annotations

import time
from pathlib import Path

from client_lib.api.auth import write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.errors import MetaFlowError
from mininet_scenarios.metaflow_net import ControllerProcess
from nat_agent.ports import listen_port
from tests.integration.fake_switch import FakeSwitch

DOWN_BOUND_S = 5.0
"""The end seen by the receiving thread at once; the bound is a loaded machine's slack."""


def switches(api: ApiClient) -> set[int]:
    return {s.dpid for s in api.call(REST.topology).switches}


def wait(what: str, check, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_switch_that_hangs_up_is_down_without_anything_sent_to_it(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    of_port, rest_port = listen_port(), listen_port()
    log = tmp_path / "controller.log"
    controller = ControllerProcess(of_port, "127.0.0.1", rest_port, secret, log).start()
    try:
        api = ApiClient(f"http://127.0.0.1:{rest_port}", secret.read_bytes().strip(), timeout=5)
        wait("the controller's REST", lambda: _answers(api), 30)
        switch = connect(of_port, dpid=7)
        try:
            wait("the switch connected", lambda: 7 in switches(api), 30)
            # Its base entries and their barrier are the last the controller sends it.
            wait("the base entries sent", lambda: any(r.cookie is not None for r in switch.messages()), 30)
            time.sleep(0.5)
        finally:
            switch.close()
        took = wait("the switch down", lambda: 7 not in switches(api), DOWN_BOUND_S)
        assert took < DOWN_BOUND_S
        assert "switch 7 disconnected" in log.read_text()
    finally:
        assert controller.stop() == 0


def connect(port: int, dpid: int) -> FakeSwitch:
    """A fake switch, once the controller's OpenFlow port listens (after its REST port)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return FakeSwitch(port, dpid)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the controller's OpenFlow port never listened"
            time.sleep(0.1)


def _answers(api: ApiClient) -> bool:
    try:
        api.call(REST.topology)
    except MetaFlowError:
        return False
    return True
