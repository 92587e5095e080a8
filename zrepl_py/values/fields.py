"""The config's value types as pydantic types, and the base model of every config table.

Every config section (``zrepl_py.config``) and every store scheme's settings
(``zrepl_py.stores.schemes``) build on these, so a size or a duration means the same in
each and a section's unknown key is an error wherever it is declared.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, PlainValidator

from zrepl_py.values.timetable import Timetable, parse_timetable
from zrepl_py.values.units import parse_cron, parse_duration, parse_size

Duration = Annotated[dt.timedelta, BeforeValidator(parse_duration)]
ByteSize = Annotated[int, BeforeValidator(parse_size)]
CronSchedule = Annotated[str, BeforeValidator(parse_cron)]
BandwidthLimit = Annotated[Timetable, PlainValidator(parse_timetable), PlainSerializer(str)]
"""Bytes per second, ``"off"``, or a weekly timetable in UTC (``values.timetable``)."""


class Table(BaseModel):
    """A table of the config: frozen once validated; an unknown key is an error
    (``extra="forbid"``), so a typo never silently disables a safety setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)
