"""What the application holds for its lifetime, built in the lifespan."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.auth import KeyResolver
from app.db.session import Database
from app.live.bus import Bus
from app.live.fanout import Fanout
from app.settings import Settings

if TYPE_CHECKING:
    from app.live.limits import StreamLimits
    from app.runner.runner import TurnRunner


@dataclass
class AppState:
    settings: Settings
    database: Database
    keys: KeyResolver
    bus: Bus
    fanout: Fanout
    runner: "TurnRunner"
    limits: "StreamLimits"
