"""The Celery broker transport: kombu's Redis transport without restoring unacked messages on close.

kombu 5.7 restores a channel's unacknowledged messages when it closes the channel, and
Celery closes the channel when the broker connection breaks. With a task in flight
(`acks_late`) and Redis restarting, that restore runs on a connection whose client is
already gone and raises AttributeError, which Celery treats as unrecoverable: the whole
worker exits (tests/controlcenter/test_faults.py found it). We do not need the restore: a run is
claimed with a conditional UPDATE, so a redelivered task is a no-op, and a run whose
worker died is failed as retryable by the heartbeat reaper (agents/heartbeat.py).
Unacked messages still come back after the visibility timeout, as with any Redis broker.

For the same reason, acknowledging (or rejecting) a message on a channel that was closed
by a broken connection is skipped: kombu would build a client from the closed transport
and raise AttributeError, again ending the worker just as its task finished.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis

logger = logging.getLogger(__name__)


class Channel(redis.Channel):
    do_restore = False

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if self.closed:
            logger.warning("broker connection was lost; message %s stays unacked until redelivered", delivery_tag)
            return
        super().basic_ack(delivery_tag, multiple)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self.closed:
            logger.warning("broker connection was lost; message %s not rejected", delivery_tag)
            return
        super().basic_reject(delivery_tag, requeue)


class Transport(redis.Transport):
    Channel = Channel
