"""``amqp.publish_confirmed``: a batch in one write, confirmed, against a real broker.

It keeps aiormq's channel books itself, so these check what would break if aiormq changed
them: the order, every confirm, a nack, a body larger than a frame, and the delivery tags
staying in step with aiormq's own ``basic_publish`` on the same channel.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel
from pamqp.commands import Basic

from shared.infra.amqp import Outgoing, publish_confirmed
from shared.infra.settings import Settings


@pytest.fixture
async def channel(settings: Settings) -> AsyncIterator[AbstractChannel]:
    """A channel with publisher confirms (aio-pika's, as the services open them)."""
    connection = await aio_pika.connect_robust(settings.amqp_url)
    try:
        yield await connection.channel(publisher_confirms=True)
    finally:
        await connection.close()


@pytest.fixture
async def underlay(channel: AbstractChannel) -> aiormq.Channel:
    """Its aiormq channel, which ``publish_confirmed`` writes on."""
    underlay = await channel.get_underlay_channel()
    assert isinstance(underlay, aiormq.Channel)
    return underlay


async def a_queue(
    channel: AbstractChannel, settings: Settings, **arguments: int | str
) -> aio_pika.abc.AbstractQueue:
    name = f"{settings.prefix}confirmed.{uuid.uuid4().hex[:8]}"
    return await channel.declare_queue(name, exclusive=True, arguments=arguments)


def message(queue: str, body: bytes, message_id: str = "") -> Outgoing:
    """To ``queue`` through the default exchange."""
    return Outgoing("", queue, body, Basic.Properties(message_id=message_id or None))


async def received(queue: aio_pika.abc.AbstractQueue) -> list[tuple[bytes, str | None]]:
    """Every message now in the queue: body and message id, in order."""
    got = []
    while (incoming := await queue.get(fail=False, no_ack=True)) is not None:
        got.append((incoming.body, incoming.message_id))
    return got


async def test_a_batch_arrives_whole_and_in_order(
    channel: AbstractChannel, underlay: aiormq.Channel, settings: Settings
) -> None:
    queue = await a_queue(channel, settings)
    big = bytes(range(256)) * 1200  # 300 KB: more than one frame (RabbitMQ's frame_max 128 KB)
    assert len(big) > underlay.max_content_size
    bodies = [b"%d" % n for n in range(300)] + [big, b""]
    await publish_confirmed(
        underlay, [message(queue.name, body, f"m{n}") for n, body in enumerate(bodies)]
    )
    assert underlay.confirmations == {}  # every confirm came and was taken
    got = []
    for _ in range(50):
        got += await received(queue)
        if len(got) == len(bodies):
            break
    assert got == [(body, f"m{n}") for n, body in enumerate(bodies)]


async def test_a_batch_and_basic_publish_share_a_channel(
    channel: AbstractChannel, underlay: aiormq.Channel, settings: Settings
) -> None:
    queue = await a_queue(channel, settings)
    await publish_confirmed(underlay, [message(queue.name, b"1"), message(queue.name, b"2")])
    confirm = await underlay.basic_publish(b"3", routing_key=queue.name)
    assert isinstance(confirm, Basic.Ack)  # aiormq's tag after ours: in step
    await publish_confirmed(underlay, [message(queue.name, b"4")])
    await publish_confirmed(underlay, [])
    assert [body for body, _ in await received(queue)] == [b"1", b"2", b"3", b"4"]


async def test_a_nacked_message_fails_the_batch(
    channel: AbstractChannel, underlay: aiormq.Channel, settings: Settings
) -> None:
    full = await a_queue(channel, settings, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    other = await a_queue(channel, settings)
    with pytest.raises(aiormq.exceptions.DeliveryError):
        await publish_confirmed(underlay, [message(full.name, b"kept"), message(full.name, b"x")])
    await publish_confirmed(underlay, [message(other.name, b"after")])  # the channel goes on
    assert [body for body, _ in await received(full)] == [b"kept"]
    assert [body for body, _ in await received(other)] == [b"after"]


async def test_only_an_aiormq_channel_will_do(channel: AbstractChannel) -> None:
    with pytest.raises(TypeError):
        await publish_confirmed(channel, [message("nowhere", b"x")])  # type: ignore[arg-type]
