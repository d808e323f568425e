"""Every test here checks that the turn machine moves only along its declared table."""

from tests.support.turn_moves import moves_by_the_table

__all__ = ["moves_by_the_table"]
