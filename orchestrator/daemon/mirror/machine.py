"""Which cloud machine this daemon runs on, for the mirror's lease: `orch watch` asks the cloud
whether a silent lease's machine is really gone before it replaces it. EC2 only for now, and only
where [preemption] sources names "aws" (the config says this is an EC2 instance; elsewhere the
link-local metadata address is never tried). Read from IMDSv2 on the mirror's thread, never on
the training path; asked again at most once a minute until it answers, then kept."""

from __future__ import annotations

import logging
from typing import Any, Optional

from ..preemption import AwsSource, SourceUnavailable

log = logging.getLogger("orch.mirror")

RETRY_S = 60.0


class MachineIdentity:
    def __init__(self, preemption: Any, source: Optional[AwsSource] = None):
        self._source = source
        if source is None and "aws" in preemption.sources:
            self._source = AwsSource(preemption.aws_endpoint, preemption.timeout_seconds)
        self._value: Optional[str] = None
        self._next_try = 0.0

    def instance_id(self, now: float) -> Optional[str]:
        if self._value is not None or self._source is None or now < self._next_try:
            return self._value
        try:
            self._value = self._source.instance_id(now)
        except SourceUnavailable as exc:
            log.info("mirror: this machine's EC2 instance id is unknown for now (%s)", exc)
        if self._value is None:
            self._next_try = now + RETRY_S
        return self._value
