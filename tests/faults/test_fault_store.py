"""One damaged conversation.json (not UTF-8, nested too deeply, numbers out of range)
is reported as unreadable, in one line naming the file, and every other conversation
stays usable: list, search, last opened, and the app's conversation list (F3)."""

from __future__ import annotations

import pytest

from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import CONVERSATION_FILE, SessionCorrupt, SessionStore, Turn
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp

GOOD_JSON = (
    '{"format":"ssdmoe-conversation","version":1,"id":"%s","created":1,"updated":2,'
    '"turns":[{"role":"user","text":"hi","token_ids":[1],"k":%s}]}'
)
BAD_ID = "20200101-000000-abcdef"

DAMAGE = {
    "not-utf8": b'{"format": "ssdmoe-conversation", "title": "\xff\xfe"}',
    "deeply-nested": b"[" * 100_000 + b"]" * 100_000,
    "k-overflow": (GOOD_JSON % (BAD_ID, "1e400")).encode(),
    "k-float": (GOOD_JSON % (BAD_ID, "2.5")).encode(),
    "created-inf": (GOOD_JSON % (BAD_ID, "4")).replace('"created":1', '"created":1e400').encode(),
    "token-id-huge": (GOOD_JSON % (BAD_ID, "4"))
    .replace("[1]", "[1180591620717411303424]")
    .encode(),
    "version-overflow": (GOOD_JSON % (BAD_ID, "4"))
    .replace('"version":1', '"version":1e400')
    .encode(),
    "missing-id": b'{"format":"ssdmoe-conversation","created":1,"updated":2}',
}


def seed(store: SessionStore, text: str) -> str:
    conv = store.create("demo-model", "fp")
    store.add_turn(conv, Turn("user", text, [1, 2]))
    store.add_turn(conv, Turn("assistant", "ok", [3], k=4))
    return conv.id


def plant(store: SessionStore, data: bytes) -> None:
    folder = store.folder(BAD_ID)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONVERSATION_FILE).write_bytes(data)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_one_damaged_conversation_leaves_the_others_usable(tmp_path, kind):
    store = SessionStore(tmp_path)
    good = seed(store, "hello there")
    plant(store, DAMAGE[kind])
    with pytest.raises(SessionCorrupt) as e:
        store.get(BAD_ID)
    msg = str(e.value)
    assert "\n" not in msg and str(store.folder(BAD_ID) / CONVERSATION_FILE) in msg
    problems: list[str] = []
    assert [s.id for s in store.list(problems.append)] == [good]
    assert len(problems) == 1 and BAD_ID in problems[0]
    assert [s.id for s in store.search("there", problems.append)] == [good]
    store.mark_opened(BAD_ID)  # the damaged one was the last opened: fall back
    assert store.last_opened() in (BAD_ID, good)  # its file exists; opening it says why
    (tmp_path / ".last_opened").unlink()
    assert store.last_opened() == good


async def test_conversation_list_in_the_app_survives_a_damaged_file():
    """F3 with a non-UTF-8, a deeply nested and an overflowing conversation present: the
    app does not crash, lists them as unreadable with their reason, and the good one
    opens."""
    from tests.helpers.pilot import SIZE, errors, open_list, opened, wait_until

    store = SessionStore()
    good = seed(store, "still readable")
    for i, kind in enumerate(("not-utf8", "deeply-nested", "k-overflow")):
        conv_id = f"2020010{i + 1}-000000-abcdef"
        folder = store.folder(conv_id)
        folder.mkdir(parents=True)
        (folder / CONVERSATION_FILE).write_bytes(
            DAMAGE[kind].replace(BAD_ID.encode(), conv_id.encode())
        )
    app = SsdmoeApp(ChatSettings(), engine_factory=None, session_store=AppSessions(store))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_list(pilot, app, "f3")
        assert [s.id for s in screen.summaries] == [good]
        told = [n.message for n in app._notifications if "unreadable" in n.message]
        assert len(told) == 1 and "(+2 more)" in told[0] and "\n" not in told[0]
        assert "20200103-000000-abcdef" in told[0]  # the first one named, by its file
        # The three are listed as unreadable (below the good one), each with its reason.
        bad = [f"2020010{i}-000000-abcdef" for i in (3, 2, 1)]
        assert [s.id for s in screen.unreadable] == bad
        rows = [str(screen.option_list.get_option(i).prompt) for i in bad]
        assert all("Unreadable conversation" in r for r in rows)
        assert "not UTF-8" in rows[2] and "nested too deeply" in rows[1] and "k must be" in rows[0]
        # Opening one says why in one line; the list stays usable.
        screen.option_list.highlighted = screen.option_list.get_option_index(bad[2])
        await pilot.press("enter")
        await wait_until(pilot, lambda: errors(app), what="the open error")
        assert "not UTF-8" in errors(app)[-1] and "\n" not in errors(app)[-1]
        screen = await open_list(pilot, app, "f3")
        await pilot.press("enter")
        await opened(pilot, app, good)
    assert app.return_code in (None, 0)
