from mars2.data import Problem, TestCase
from mars2.search.prompts import chat_messages, extract_code, generate_prompt


def test_extract_last_complete_block():
    text = "Idea\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\n"
    assert extract_code(text) == "print(2)"


def test_extract_accepts_bare_fence_and_unclosed_final_block():
    assert extract_code("```\nx = 1\n```") == "x = 1"
    assert extract_code("sure\n```python\nprint(3)\n") == "print(3)"


def test_extract_none_without_code():
    assert extract_code("no code here") is None
    assert extract_code("```python\n\n```") is None


def test_generate_prompt_has_statement_and_starter_code():
    p = Problem(id="x", title="t", statement="Add two numbers.", public_tests=(TestCase("1\n2", "3", "functional"),),
                hidden_tests=(), testtype="functional", func_name="add",
                starter_code="class Solution:\n    def add(self, a, b):\n        ")
    text = generate_prompt(p)
    assert "Add two numbers." in text and "def add(self, a, b)" in text and "```python" in text


def test_role_prompt_becomes_system_turn():
    assert chat_messages("u", "be terse")[0] == {"role": "system", "content": "be terse"}
    assert chat_messages("u") == [{"role": "user", "content": "u"}]
