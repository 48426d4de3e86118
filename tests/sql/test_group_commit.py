"""Group commit: a failed write leaves nothing behind, whatever the way it fails; the others commit."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tinystore.engines.sql import SqlEngine
from tinystore.errors import ConflictError, TinystoreError
from tinystore.limits import Limits

SCHEMA = [
    (
        "001",
        """
create table t (id integer primary key, v text);
create table f (id integer primary key, u integer unique on conflict fail);
create table r (id integer primary key, v text);
create trigger r_no before insert on r when new.v = 'boom' begin select raise(rollback, 'boom refused'); end;
""",
    )
]


async def test_fail_partial_statement_leaves_nothing(tmp_path: Path) -> None:
    eng = SqlEngine(tmp_path, Limits())
    db, _ = await eng.open("x", SCHEMA)
    for round_ in range(20):
        base = round_ * 100
        futs = [
            db.write("insert into t (v) values (?)", [f"a{round_}"]),
            db.write("insert into f (u) values (?)", [base + 1]),
            # inserts base+2 then fails on base+1 (OR FAIL keeps what the statement did before)
            db.write(
                "insert into f (u) select value from (select ? as value union all select ?)", [base + 2, base + 1]
            ),
            db.write("insert into t (v) values (?) returning id, v", [f"b{round_}"]),
            db.write("insert into r (v) values ('boom')", []),
            db.write("insert into t (v) values (?)", [f"c{round_}"]),
        ]
        res = await asyncio.gather(*futs, return_exceptions=True)

        assert isinstance(res[2], ConflictError), res
        assert isinstance(res[4], TinystoreError), res
        assert [type(x).__name__ for i, x in enumerate(res) if i not in (2, 4)] == ["Done"] * 4
        assert res[3].rows[0][1] == f"b{round_}" and res[3].columns == ["id", "v"]
        assert res[3].rows[0][0] == res[3].last_insert_rowid
        rows = (await db.read("select u from f where u >= ? and u < ?", [base, base + 100])).rows
        assert rows == [(base + 1,)], rows
        vs = [r[0] for r in (await db.read("select v from t where v like ?", [f"%{round_}"])).rows]
        assert sorted(vs) == sorted([f"a{round_}", f"b{round_}", f"c{round_}"]), vs
        assert (await db.read("select count(*) from r", [])).rows == [(0,)]
    print(db.stats)
    await eng.close()


# contract: SQL-06
async def test_writes_that_arrive_during_a_batch_join_its_commit(tmp_path: Path) -> None:
    """Writes handed over while a batch's statements run share its commit (one fsync for all), and one that
    fails among them still fails alone."""
    eng = SqlEngine(tmp_path, Limits())
    db, _ = await eng.open("x", SCHEMA)
    commits = db.stats["commits"]
    # a statement that keeps the writer busy for a while (some 10^6 steps of a recursive CTE)
    slow = db.write(
        "insert into t (v) select 'slow ' || max(x) from "
        "(with recursive c(x) as (select 1 union all select x + 1 from c where x < 1000000) select x from c)",
        [],
    )
    await asyncio.sleep(0.01)  # it runs on the writer now (or is still queued: then all share one batch anyway)
    late = [db.write("insert into t (v) values (?)", [f"late {i}"]) for i in range(20)]
    late.append(db.write("insert into f (u) values (1)", []))
    late.append(db.write("insert into f (u) values (1)", []))  # a conflict: fails alone
    res = await asyncio.gather(slow, *late, return_exceptions=True)
    assert isinstance(res[-1], ConflictError), res[-1]
    assert all(not isinstance(r, BaseException) for r in res[:-1]), res
    assert db.stats["commits"] - commits == 1, db.stats
    count = (await db.read("select count(*) from t where v like 'late %' or v like 'slow %'", [])).rows
    assert count == [(21,)]
    await eng.close()


# contract: SQL-06
async def test_a_deferred_constraint_broken_by_one_write_fails_it_alone(tmp_path: Path) -> None:
    """SQLite checks a deferred foreign key at COMMIT, which a group's writes share: the one write that broke it
    fails, with SQLite's message; the others commit."""
    eng = SqlEngine(tmp_path, Limits())
    db, _ = await eng.open(
        "x",
        [
            (
                "001",
                "create table parent (id integer primary key);\n"
                "create table child (id integer primary key, parent integer "
                "references parent (id) deferrable initially deferred);\n"
                "create table other (id integer primary key, v text);\n"
                "insert into parent (id) values (1);",
            )
        ],
    )
    for _ in range(3):
        res = await asyncio.gather(
            db.write("insert into other (v) values ('a')", []),
            db.write("insert into child (parent) values (1)", []),
            db.write("insert into child (parent) values (99)", []),  # no such parent: fails at COMMIT
            db.write("insert into other (v) values ('b')", []),
            return_exceptions=True,
        )
        assert isinstance(res[2], ConflictError) and "FOREIGN KEY" in str(res[2]), res
        assert all(not isinstance(r, BaseException) for i, r in enumerate(res) if i != 2), res
    assert (await db.read("select count(*) from other", [])).rows == [(6,)]
    assert (await db.read("select count(*) from child", [])).rows == [(3,)]
    assert (await db.read("select count(*) from child where parent = 99", [])).rows == [(0,)]
    await eng.close()
