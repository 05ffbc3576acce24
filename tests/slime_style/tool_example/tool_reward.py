"""The example's reward helper, imported by its sibling as slime's examples do (`from qa_em_format import ...`)."""


def score_answer(response: str, label) -> float:
    return 1.0 if str(label) in response else 0.0
