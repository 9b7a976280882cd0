"""What the application holds for its lifetime, built in the lifespan."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.auth import KeyResolver
from app.catalog.registry import Catalog
from app.db.reads import Reads
from app.db.session import Database
from app.live.bus import Bus
from app.live.cache import PageCache
from app.live.fanout import Fanout
from app.metrics import Metrics
from app.settings import Settings

if TYPE_CHECKING:
    from app.journal.admission import TurnAdmission
    from app.live.limits import StreamLimits
    from app.runner.runner import TurnRunner


@dataclass
class AppState:
    settings: Settings
    database: Database
    reads: Reads
    cache: PageCache
    keys: KeyResolver
    bus: Bus
    fanout: Fanout
    runner: "TurnRunner"
    limits: "StreamLimits"
    admission: "TurnAdmission"
    catalog: Catalog
    # None when METRICS_ENABLED is off.
    metrics: Metrics | None = None
    # Set once, when the graceful drain begins (app/ops/drain.py): new streams and
    # turns are refused and /ready answers 503. One attribute read per stream open.
    draining: bool = False
