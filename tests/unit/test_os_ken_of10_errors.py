"""An OpenFlow 1.0 error must not close the switch's connection.

os-ken's handler of every error message reads `OFPET_EXPERIMENTER` from the
connection's ofproto module, which OpenFlow 1.0's lacks; before controller.app
supplied it, a standby's first refused packet-out (two controllers on Open
vSwitch, the deploy walkthrough) raised AttributeError in the receive loop and
the connection died, over and over. Run here on os-ken's real handler and a
real OF 1.0 error.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from os_ken.controller.ofp_handler import OFPHandler
from os_ken.ofproto import ofproto_v1_0, ofproto_v1_0_parser

import controller.app  # noqa: F401  (supplies the constant, as the daemon does)


def test_os_kens_error_handler_takes_an_of10_error():
    datapath = SimpleNamespace(ofproto=ofproto_v1_0, ofproto_parser=ofproto_v1_0_parser, id=1)
    refused = ofproto_v1_0_parser.OFPErrorMsg(datapath, ofproto_v1_0.OFPET_BAD_REQUEST,
                                              ofproto_v1_0.OFPBRC_EPERM, b"\x01\x0d\x00\x08\x00\x00\x00\x07")
    refused.xid = 7
    refused.serialize()
    handler = SimpleNamespace(logger=logging.getLogger("test"))
    OFPHandler.error_msg_handler(handler, SimpleNamespace(msg=refused))
    assert ofproto_v1_0.OFPET_EXPERIMENTER not in (refused.type, ofproto_v1_0.OFPET_BAD_REQUEST)
