"""What a failed command on a node says: never an empty cause, and a command that does not answer in
time is named with its seconds (the same for SSH and local nodes). Local processes, no SSH needed."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest

from homegpu.remote.nodes.transport import CommandTimeout, LocalTransport, TransportError, cause


def test_an_exception_without_a_message_is_said_by_its_type():
    assert cause(asyncssh.ConnectionLost("")) == "connection lost"
    assert cause(TimeoutError()) == "timeout error"
    assert cause(OSError("No route to host")) == "No route to host"


async def test_a_command_past_its_timeout_is_a_transport_error_naming_it():
    with pytest.raises(CommandTimeout, match=r"^sleep did not answer within 0.5 s") as caught:
        await LocalTransport().run(["sleep", "5"], timeout=0.5)
    assert isinstance(caught.value, TransportError) and not isinstance(caught.value, asyncio.TimeoutError)
