"""Where the tests find the project: the repository root, the tests' own fixtures, and the team's shared data folder
beside the checkout (tests that read it skip cleanly where it is absent)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED = ROOT.parent / "shared"
