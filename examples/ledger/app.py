"""TStream's streaming ledger (SL): transfers that move money and assets together, atomically.

Run it with ``epochal run examples.ledger.app:app``; ``Deposit`` and ``Transfer`` share the input
topic ``ledger.in.ledger`` as tagged structs (``{"type": "Deposit", ...}``).

A transfer touches four actors of two types (a source and a target ``Account``, a source and a
target ``Asset``), usually on four different partitions. It must happen in both ledgers or in
neither: if either source holds less than the amount, the whole transfer aborts (the handler
says which source, and the ``balance >= 0`` constraints of both types stand behind it). Both
totals are therefore conserved by transfers, whatever the partitioning.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = [
    "ACCOUNTS",
    "ASSETS",
    "Account",
    "Asset",
    "Deposit",
    "InsufficientFunds",
    "Transfer",
    "account_key",
    "app",
    "asset_key",
    "deposit",
    "transfer",
]

ACCOUNTS = 10_000
ASSETS = 10_000

AccountKey = Annotated[str, msgspec.Meta(pattern=r"^acct-\d{4}$")]
AssetKey = Annotated[str, msgspec.Meta(pattern=r"^asset-\d{4}$")]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(gt=0)]

NON_NEGATIVE = {"balance >= 0": lambda state: state.balance >= 0}


def account_key(number: int) -> str:
    """``acct-0042``: fixed width, so string order is numeric order."""
    return f"acct-{number:04d}"


def asset_key(number: int) -> str:
    """``asset-0042``: fixed width, so string order is numeric order."""
    return f"asset-{number:04d}"


app = App("ledger")


@app.actor(key=str, constraints=NON_NEGATIVE, key_sample=[account_key(i) for i in range(ACCOUNTS)])
class Account(msgspec.Struct):
    """A money balance."""

    balance: int = 0


@app.actor(key=str, constraints=NON_NEGATIVE, key_sample=[asset_key(i) for i in range(ASSETS)])
class Asset(msgspec.Struct):
    """A quantity of some asset (securities, say) held beside an account."""

    balance: int = 0


class InsufficientFunds(ValueError):
    """A transfer's source holds less than the amount: the transfer aborts in both ledgers."""


class Deposit(msgspec.Struct, frozen=True, tag=True):
    """Money into an account and units into an asset, in one transaction."""

    account: AccountKey
    asset: AssetKey
    account_amount: NonNegative
    asset_amount: NonNegative


class Transfer(msgspec.Struct, frozen=True, tag=True):
    """``amount`` from one account to another and from one asset to another, atomically."""

    src_account: AccountKey
    dst_account: AccountKey
    src_asset: AssetKey
    dst_asset: AssetKey
    amount: Positive


@app.transaction(
    topic="ledger", event=Deposit, keys=lambda e: {Account: [e.account], Asset: [e.asset]}
)
def deposit(ctx: Context, e: Deposit) -> None:
    """Credit both ledgers."""
    account, asset = ctx.get(Account, e.account), ctx.get(Asset, e.asset)
    account.balance += e.account_amount
    asset.balance += e.asset_amount
    ctx.put(e.account, account)
    ctx.put(e.asset, asset)


@app.transaction(
    topic="ledger",
    event=Transfer,
    keys=lambda e: {
        Account: [e.src_account, e.dst_account],
        Asset: [e.src_asset, e.dst_asset],
    },
    aborts_to="errors",
)
def transfer(ctx: Context, e: Transfer) -> None:
    """Debit both sources, credit both targets; a source short of ``amount`` aborts it all."""
    legs: tuple[tuple[type[Account] | type[Asset], str, str], ...] = (
        (Account, e.src_account, e.dst_account),
        (Asset, e.src_asset, e.dst_asset),
    )
    for cls, src, dst in legs:
        source = ctx.get(cls, src)
        if source.balance < e.amount:  # checked before any credit, so a self-transfer too
            raise InsufficientFunds(f"{cls.__name__} {src} holds {source.balance} < {e.amount}")
        source.balance -= e.amount
        ctx.put(src, source)
        target = ctx.get(cls, dst)  # after the put: src == dst reads the debited copy
        target.balance += e.amount
        ctx.put(dst, target)
