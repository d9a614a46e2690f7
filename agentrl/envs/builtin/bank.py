"""Bank: accounts with integer balances. Small, but every mutation returns the new balance so a
plan can chain on it (open -> deposit -> transfer all)."""

from __future__ import annotations

from typing import TypedDict

from agentrl.envs.builtin.base import Domain, ToolError, check_positive, check_text


class AccountId(TypedDict):
    account_id: str


class Balance(TypedDict):
    balance: int


class TransferResult(TypedDict):
    from_balance: int
    to_balance: int


class Bank(Domain):
    """State: ``{"seq": int, "accounts": {id: {"owner": str, "balance": int}}}``."""

    id_prefix = "A"
    records_key = "accounts"

    def open_account(self, owner: str) -> AccountId:
        """Open a new account with balance 0 and return its id.

        Args:
            owner: Name of the account owner.
        """
        check_text(owner, "owner", 40)
        account_id = self._new_id()
        self.records[account_id] = {"owner": owner, "balance": 0}
        return {"account_id": account_id}

    def deposit(self, account_id: str, amount: int) -> Balance:
        """Add money to an account and return the new balance.

        Args:
            account_id: Id of the account, e.g. A1234.
            amount: Amount to add (positive integer).
        """
        account = self._get(account_id, "account")
        check_positive(amount)
        account["balance"] += amount
        return {"balance": account["balance"]}

    def withdraw(self, account_id: str, amount: int) -> Balance:
        """Take money out of an account and return the new balance.

        Args:
            account_id: Id of the account, e.g. A1234.
            amount: Amount to take out (positive integer, at most the balance).
        """
        account = self._get(account_id, "account")
        check_positive(amount)
        if amount > account["balance"]:
            raise ToolError(f"insufficient funds: balance of {account_id} is {account['balance']}")
        account["balance"] -= amount
        return {"balance": account["balance"]}

    def transfer(self, from_id: str, to_id: str, amount: int) -> TransferResult:
        """Move money from one account to another and return both new balances.

        Args:
            from_id: Id of the account to take money from.
            to_id: Id of the account to put money into.
            amount: Amount to move (positive integer, at most the balance of from_id).
        """
        source = self._get(from_id, "account")
        target = self._get(to_id, "account")
        check_positive(amount)
        if from_id == to_id:
            raise ToolError("from_id and to_id must be different accounts")
        if amount > source["balance"]:
            raise ToolError(f"insufficient funds: balance of {from_id} is {source['balance']}")
        source["balance"] -= amount
        target["balance"] += amount
        return {"from_balance": source["balance"], "to_balance": target["balance"]}

    def get_balance(self, account_id: str) -> Balance:
        """Return the current balance of an account.

        Args:
            account_id: Id of the account, e.g. A1234.
        """
        return {"balance": self._get(account_id, "account")["balance"]}
