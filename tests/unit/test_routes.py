"""Static routes (`client_lib.routes`, ``--route``): the switches' longest
prefix match given to a client, and the tables it refuses."""

from __future__ import annotations

import pytest

from client_lib.cidr import Block
from client_lib.errors import InvalidArgument
from client_lib.routes import parse_route, static_route

SPACE = Block.parse("100.64.0.0/10")


def test_the_longest_prefix_names_the_agent() -> None:
    route = static_route([parse_route("100.64.0.0/10=a:1", 9000), parse_route("100.96.0.0/11=b", 9000),
                          parse_route("100.112.0.0/12=[::1]:7", 9000)], SPACE)
    assert route("100.64.0.1") == ("a", 1)
    assert route("100.96.0.1") == ("b", 9000)             # the default port
    assert route("100.112.3.4") == ("::1", 7)             # inside all three: the /12 wins
    assert route("100.127.255.255") == ("::1", 7)


@pytest.mark.parametrize("entries, refusal", [
    (["100.64.0.0/11=a"], "100.96.0.0 of 100.64.0.0/10 uncovered"),
    (["100.64.0.0/11=a", "100.112.0.0/12=b"], "100.96.0.0 of 100.64.0.0/10 uncovered"),
    (["100.64.0.0/10=a", "10.0.0.0/8=b"], "10.0.0.0/8: outside the space"),
    (["100.64.0.0/10=a", "100.64.0.0/10=b"], "given twice"),
])
def test_a_table_that_leaves_ids_nowhere_to_go_is_refused(entries: list[str], refusal: str) -> None:
    with pytest.raises(InvalidArgument, match=refusal):
        static_route([parse_route(entry, 9000) for entry in entries], SPACE)


@pytest.mark.parametrize("text", ["100.64.0.0/10", "100.64.0.1/10=a", "nonsense=a", "100.64.0.0/10=",
                                  "100.64.0.0/10=a:0", "100.64.0.0/10=a:b"])
def test_a_malformed_route_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="route|via"):
        parse_route(text, 9000)
