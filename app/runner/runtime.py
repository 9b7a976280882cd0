"""What the runner's modules share while turns run on this process."""

import asyncio
import uuid
from dataclasses import dataclass, field

from app.db.admission import Units
from app.db.reads import Reads
from app.live.bus import Bus
from app.runner.fence import Fence
from app.runner.history import History
from app.runner.progress import LiveStep
from app.settings import Settings


@dataclass(slots=True)
class Runtime:
    settings: Settings
    database: Units
    # Single-statement reads on the driver (app/db/reads.py): what a turn polls on
    # every wake-up of its session.
    reads: Reads
    bus: Bus
    fence: Fence
    history: History
    # The step each streaming message of a turn run here is in, by message id.
    live: dict[uuid.UUID, LiveStep] = field(default_factory=dict)
    # Set by every wake-up of a session whose turn runs here: time to check for a
    # cancel request, an Action, or an approval's decision.
    watches: dict[uuid.UUID, asyncio.Event] = field(default_factory=dict)
