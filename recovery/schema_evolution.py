"""Actor schemas across deploys: the start's check, the migrations a restore runs, the tables.

Every snapshot records the actor schemas of the code that took it (``Manifest.schemas``). A
start compares them with the app's before any worker runs (:func:`check_schemas`):

- fields added, numbers widened, actor types added: nothing to do (the change is logged);
- an actor type removed: its actors stay in the warehouse, not restored (a warning says how
  many);
- a removed field that holds data (a value other than its default, in any actor), or a field
  whose type changed otherwise: refused in one line naming the type and the field, unless the
  app declares a migration for the type (``@app.migration``). A removed field and an added one of
  the same type are named as a likely rename.

A restore from a snapshot whose schema of a type differs runs the type's migration over each of
its actors (:func:`migrations_for`); the engine loads the results as changes, so the first
snapshot after holds every migrated actor and records the new schema: later restores run
nothing. The Delta tables follow at that snapshot's commit (:func:`evolve_table`): new columns
are added (old rows read null), and a column whose type changed is rewritten once, its old
values cast where Arrow casts them exactly (``long`` to ``double``), else null (the ``_state``
column still holds every old value). Columns of removed fields stay, null from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, write_deltalake
from deltalake import Schema as DeltaSchema

from epochal.actors.api import App
from epochal.actors.snapshots import migrations_named
from epochal.errors import RecoveryError
from epochal.schemas.actor_schemas import ActorSchema, schemas_of
from epochal.schemas.evolution import ChangeKind, FieldChange, schema_changes
from epochal.schemas.snapshots import Manifest

__all__ = ["app_schemas", "check_schemas", "evolve_table", "migrations_for"]

logger = logging.getLogger(__name__)

Migrate = Callable[[bytes], bytes | None]
_EXACT_CASTS = {(pa.int64(), pa.float64())}  # (old, new) Arrow types whose values cast exactly


def app_schemas(app: App) -> dict[str, ActorSchema]:
    """The schema of each of the app's actor types."""
    return schemas_of({name: t.state for name, t in app.actor_types.items()})


def _by_type(changes: list[FieldChange]) -> dict[str, list[FieldChange]]:
    grouped: dict[str, list[FieldChange]] = {}
    for change in changes:
        grouped.setdefault(change.actor_type, []).append(change)
    return grouped


def migrations_for(app: App, manifest: Manifest) -> dict[str, Migrate]:
    """Per actor type, what a restore from ``manifest`` runs over each old value: the app's
    migration, for the types whose recorded schema differs from the app's."""
    if not manifest.schemas or not app.migrations:
        return {}
    changed = _by_type(schema_changes(manifest.schemas, app_schemas(app)))
    return migrations_named(
        app, [name for name in app.migrations if name in changed and name in manifest.schemas]
    )


def check_schemas(
    app: App, manifest: Manifest | None, states: Callable[[str, Manifest], pa.Table]
) -> None:
    """Refuse a start whose actor schemas the snapshot ``manifest`` cannot be read as, naming
    type and field; log what changes and what runs. ``states(actor_type, manifest)`` reads the
    ``_state`` column of a type in the snapshot (to tell whether a removed field holds data)."""
    if manifest is None:
        return
    if not manifest.schemas:
        logger.warning(
            "snapshot ssid=%d records no actor schemas (taken by an older epochal): the app's "
            "schemas are not checked against it and no migration runs", manifest.ssid,
        )  # fmt: skip
        return
    changes = schema_changes(manifest.schemas, app_schemas(app))
    for actor_type, changed in _by_type(changes).items():
        described = "; ".join(c.describe() for c in changed)
        actors = manifest.actors.get(actor_type, 0)
        if actor_type in app.migrations:
            logger.warning(
                "actor schema of %s changed since snapshot ssid=%d (%s): its migration %s runs "
                "over its %d actors as they are restored", actor_type, manifest.ssid, described,
                app.migrations[actor_type].__name__, actors,
            )  # fmt: skip
            continue
        if changed[0].kind is ChangeKind.TYPE_REMOVED:
            if actors:
                logger.warning(
                    "actor type %s is not in this version of the app: the %d actors snapshot "
                    "ssid=%d holds are not restored (its tables stay in the warehouse)",
                    actor_type, actors, manifest.ssid,
                )  # fmt: skip
            continue
        for change in changed:
            _refuse_unreadable(change, changed, manifest, states)
        logger.warning("actor schema of %s changed since snapshot ssid=%d: %s", actor_type,
                       manifest.ssid, described)  # fmt: skip


def _refuse_unreadable(
    change: FieldChange,
    changed: list[FieldChange],
    manifest: Manifest,
    states: Callable[[str, Manifest], pa.Table],
) -> None:
    where = f"{change.actor_type}.{change.field}"
    remedy = (
        f"declare a migration for it (@app.migration({change.actor_type})) to convert the "
        f"old values, or deploy a version that keeps the field as it was"
    )
    if change.kind is ChangeKind.RETYPED:
        assert change.old is not None and change.new is not None
        raise RecoveryError(
            f"actor field {where} changed type from {change.old.type} to {change.new.type} "
            f"since snapshot ssid={manifest.ssid}: its values cannot be read as the new type; "
            f"{remedy}"
        )
    if change.kind is not ChangeKind.REMOVED or not manifest.actors.get(change.actor_type):
        return
    assert change.old is not None
    holding = _holding(states(change.actor_type, manifest), change.field, change.old.default)
    if not holding:
        return
    renamed = [c.field for c in changed if c.kind is ChangeKind.ADDED and c.new is not None
               and c.new.type == change.old.type]  # fmt: skip
    hint = f" (renamed to {renamed[0]!r}? a rename resets every value)" if renamed else ""
    raise RecoveryError(
        f"actor field {where} ({change.old.type}) is not in this version of the app{hint}, "
        f"but {holding} actors of snapshot ssid={manifest.ssid} hold a value other than its "
        f"default in it, which a start would drop; {remedy}"
    )


def _holding(states: pa.Table, field: str, default: str) -> int:
    """How many of the canonical values ``states`` (a ``_state`` column) hold ``field`` with
    a value other than ``default`` (its JSON)."""
    decoder = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
    count = 0
    for data in states.column("_state").to_pylist():
        raw = decoder.decode(data).get(field)
        if raw is None:
            continue
        value = msgspec.json.encode(msgspec.msgpack.decode(raw)).decode()
        count += value != default
    return count


def evolve_table(uri: str, target: pa.Schema, storage_options: dict[str, str] | None) -> bool:
    """Make the Delta table ``uri`` hold every column of ``target`` with its type: missing
    columns are added (old rows read null); a column of another type is rewritten, in one new
    version of the whole table, cast where exact, else null; columns ``target`` lacks stay.
    Whether the table changed (a new version)."""
    table = DeltaTable(uri, storage_options=storage_options)
    have = {f.name: f for f in table.schema().fields}
    wanted = DeltaSchema.from_arrow(target).fields
    missing = [f for f in wanted if f.name not in have]
    retyped = [f for f in wanted if f.name in have and have[f.name].type != f.type]
    if retyped:
        _rewrite(table, uri, target, {f.name for f in retyped}, storage_options)
        return True
    if missing:
        logger.info("table gains columns table=%s columns=%s", uri, [f.name for f in missing])
        table.alter.add_columns([Field.from_arrow(target.field(f.name)) for f in missing])
        return True
    return False


def _nulls(data: pa.Table, field: pa.Field) -> pa.Array:
    return pa.nulls(data.num_rows, field.type)


def _rewrite(
    table: DeltaTable,
    uri: str,
    target: pa.Schema,
    retyped: set[str],
    storage_options: dict[str, str] | None,
) -> None:
    data = table.to_pyarrow_table()
    columns, fields = [], []
    for field in target:
        if field.name not in data.column_names:
            columns.append(_nulls(data, field))
        elif field.name in retyped:
            old = data.column(field.name)
            exact = (old.type, field.type) in _EXACT_CASTS
            columns.append(pc.cast(old, field.type) if exact else _nulls(data, field))
            if not exact:
                logger.warning(
                    "column %s of table %s changes type from %s to %s: its rows before read "
                    "null (their _state holds the old values)", field.name, uri, old.type,
                    field.type,
                )  # fmt: skip
        else:
            columns.append(data.column(field.name))
        fields.append(field)
    for name in data.column_names:  # columns of removed fields: kept as they are
        if name not in target.names:
            columns.append(data.column(name))
            fields.append(data.schema.field(name))
    logger.warning("rewriting table %s once for new column types %s (%d rows)", uri,
                   sorted(retyped), data.num_rows)  # fmt: skip
    write_deltalake(uri, pa.Table.from_arrays(columns, schema=pa.schema(fields)),
                    mode="overwrite", schema_mode="overwrite",
                    storage_options=storage_options)  # fmt: skip
