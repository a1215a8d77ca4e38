"""Privacy ledger: a per-dataset (ε, δ) budget under basic composition.

Pure logic; the servers persist `epsilon_spent`/`delta_spent` durably and rebuild
a Ledger from them.  Amounts are exact rationals so that a budget split into
many equal parts sums back to the total exactly.
"""

from __future__ import annotations

from fractions import Fraction

from svtagg.dp.errors import BudgetExhausted
from svtagg.dp.kinds import as_fraction
from svtagg.dp.queries import Budget


class Ledger:
    """Charges streams against (ε_total, δ_total) at open; refuses overdrafts."""

    def __init__(
        self,
        epsilon_total: Fraction | int | float | str,
        delta_total: Fraction | int | float | str = 0,
        epsilon_spent: Fraction | int | float | str = 0,
        delta_spent: Fraction | int | float | str = 0,
    ) -> None:
        self.epsilon_total = as_fraction(epsilon_total, "epsilon_total")
        self.delta_total = as_fraction(delta_total, "delta_total")
        self.epsilon_spent = as_fraction(epsilon_spent, "epsilon_spent")
        self.delta_spent = as_fraction(delta_spent, "delta_spent")
        if self.epsilon_total <= 0:
            raise ValueError(f"epsilon_total must be > 0, got {self.epsilon_total}")
        if not 0 <= self.delta_total < 1:
            raise ValueError(f"delta_total must be in [0, 1), got {self.delta_total}")
        if self.epsilon_spent < 0 or self.delta_spent < 0:
            raise ValueError("spent amounts must be >= 0")

    def can_charge(self, epsilon: Fraction, delta: Fraction = Fraction(0)) -> bool:
        return (
            self.epsilon_spent + epsilon <= self.epsilon_total
            and self.delta_spent + delta <= self.delta_total
        )

    def charge(
        self, epsilon: Fraction | int | float | str, delta: Fraction | int | float | str = 0
    ) -> None:
        """Spend (ε, δ) or raise BudgetExhausted, leaving the ledger unchanged."""
        eps = as_fraction(epsilon, "epsilon")
        dl = as_fraction(delta, "delta")
        if eps <= 0:
            raise ValueError(f"epsilon must be > 0, got {eps}")
        if dl < 0:
            raise ValueError(f"delta must be >= 0, got {dl}")
        if not self.can_charge(eps, dl):
            left = self.budget()
            raise BudgetExhausted(
                f"stream needs (ε={eps}, δ={dl}) but only (ε={left.epsilon_left}, "
                f"δ={left.delta_left}) of the budget is left"
            )
        self.epsilon_spent += eps
        self.delta_spent += dl

    def refund(self, epsilon: Fraction, delta: Fraction = Fraction(0)) -> None:
        """Give back (ε, δ) that a reservation did not use (a basic plan ending
        cleanly); never more than was spent."""
        if epsilon < 0 or delta < 0 or epsilon > self.epsilon_spent or delta > self.delta_spent:
            raise ValueError(f"cannot refund (ε={epsilon}, δ={delta}) of {self.budget()}")
        self.epsilon_spent -= epsilon
        self.delta_spent -= delta

    def budget(self) -> Budget:
        return Budget(self.epsilon_total, self.delta_total, self.epsilon_spent, self.delta_spent)
