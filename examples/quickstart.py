"""Open an embedded store, migrate, write and read: the smallest TinyStore program.

Run from the repository's root, with the venv the README makes:

    .venv/bin/python examples/quickstart.py [DIR]

DIR is ./quickstart-data unless given (a directory that does not exist is made, as tinystore.open makes it; not
the demo's ./data, which the demo owns while it runs).
"""

from __future__ import annotations

import asyncio
import sys
import time

import tinystore

MIGRATIONS = [
    ("001_chats.sql", "create table chats (id integer primary key, title text not null);"),
    (
        "002_messages.sql",
        "create table messages (id integer primary key, chat_id integer not null references chats(id), "
        "role text not null, text text not null, created_at integer not null);",
    ),
]


async def main(directory: str) -> None:
    async with await tinystore.open(directory, embedded=True) as store:
        db = await store.database("app", migrations=MIGRATIONS)

        async def start_chat(tx: tinystore.SqlTx) -> int:
            chat = await tx.exec("insert into chats (title) values (?)", "hello")
            await tx.exec(
                "insert into messages (chat_id, role, text, created_at) values (?, 'user', ?, ?)",
                chat.last_insert_rowid,
                "Hi there!",
                time.time_ns() // 1_000_000,
            )
            return chat.last_insert_rowid

        chat_id = await db.tx(start_chat)
        for row in await db.all("select role, text from messages where chat_id = ?", chat_id):
            print(f"chat {chat_id}: {row['role']}: {row['text']}")
        print("chats so far:", await db.scalar("select count(*) from chats"))
        status = await store.status()
        print(f"tinystore {status['version']} at {status['directory']} ({status['mode']})")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "./quickstart-data"))
