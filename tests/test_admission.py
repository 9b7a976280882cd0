"""The runner's admission limit (app/db/admission.py): at most `slots` of its units of
work at once, on the real database; a unit opened inside another of the same task runs
on the outer one's slot."""

import asyncio

from sqlalchemy import text

from app.db.admission import Admitted
from app.db.session import Database
from tests.support.in_process import Running
from tests.support.waits import wait_until


def admitted(running: Running, slots: int) -> Admitted:
    database: Database = running.app.state.app.database
    return Admitted(database, slots)


async def test_units_beyond_the_slots_wait_for_one_to_end(running: Running) -> None:
    units = admitted(running, 2)
    inside = 0
    most = 0
    release = asyncio.Event()

    async def unit(kind: str) -> int:
        nonlocal inside, most
        opened = units.read() if kind == "read" else units.statements()
        async with opened as db:
            inside += 1
            most = max(most, inside)
            await release.wait()
            value = (await db.execute(text("SELECT 1"))).scalar_one()
            inside -= 1
            return int(value)

    tasks = [
        asyncio.create_task(unit("read" if i % 2 else "statements")) for i in range(6)
    ]
    await wait_until(lambda: inside == 2, "two units inside", 5, 0.01)
    await asyncio.sleep(0.1)
    assert inside == 2  # four wait for a slot
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == [1] * 6
    assert most == 2


async def test_a_unit_inside_another_of_its_task_takes_no_second_slot(
    running: Running,
) -> None:
    units = admitted(running, 1)

    async def nested() -> int:
        async with units.statements(), units.read() as db:
            return int((await db.execute(text("SELECT 2"))).scalar_one())

    # With one slot, a nested unit that waited for a slot would wait forever.
    assert await asyncio.wait_for(nested(), 5) == 2
    # And the slot is free again afterwards, for another task.
    assert await asyncio.wait_for(asyncio.create_task(nested()), 5) == 2
