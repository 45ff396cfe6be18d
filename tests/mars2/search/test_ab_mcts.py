"""AB-MCTS-A: posteriors and selection rules against hand-computed cases, seeded."""

import numpy as np
import pytest

from mars2.search.ab_mcts import ABMCTSA, ROOT, DepthDecay, Expansion, Prior, ABMCTSTree, nig_posterior, thompson_draw


def test_nig_posterior_matches_the_formula_by_hand():
    prior = Prior()
    assert nig_posterior([], prior) == (0.0, 1.0, 1.0, 0.1)
    # obs 1, 0: n=2, x̄=.5, S=.5; κ=3, ν=3, m=1/3, τ²=(.1+.5+2·1·.25/3)/3
    m, kappa, nu, tau2 = nig_posterior([1.0, 0.0], prior)
    assert (kappa, nu) == (3.0, 3.0)
    assert m == pytest.approx(1 / 3) and tau2 == pytest.approx((0.1 + 0.5 + 0.5 / 3) / 3)


def test_thompson_draws_concentrate_on_the_data():
    rng = np.random.default_rng(0)
    prior = Prior()
    draws = [thompson_draw([1.0] * 50, prior, rng) for _ in range(2000)]
    m, kappa, nu, tau2 = nig_posterior([1.0] * 50, prior)
    assert np.mean(draws) == pytest.approx(m, abs=0.01)
    # marginal of μ is Student-t(ν) with scale² τ²/κ: var = τ²/κ · ν/(ν−2)
    assert np.var(draws) == pytest.approx(tau2 / kappa * nu / (nu - 2), rel=0.2)
    beta = [thompson_draw([1.0, 1.0, 0.0], Prior(dist="beta"), rng) for _ in range(4000)]
    assert np.mean(beta) == pytest.approx(2.5 / 4, abs=0.02)  # Beta(0.5+2, 0.5+1)


def test_first_ask_generates_at_the_root():
    tree = ABMCTSTree(agents=("a",))
    assert ABMCTSA().ask(tree, np.random.default_rng(0)) == Expansion(parent=ROOT, agent="a")


def test_backup_follows_the_rules():
    policy = ABMCTSA()
    tree = ABMCTSTree(agents=("a", "b"))
    n0 = policy.tell(tree, Expansion(ROOT, "a"), 0.2)
    n1 = policy.tell(tree, Expansion(n0, "b"), 0.6)
    n2 = policy.tell(tree, Expansion(n1, "a"), 1.0)
    assert (n0, n1, n2) == (0, 1, 2)
    assert [tree.nodes[i].depth for i in range(3)] == [1, 2, 3]
    assert tree.agent_scores == {"a": [0.2, 1.0], "b": [0.6]}
    assert tree.root.gen_obs == [0.2] and tree.root.cont_obs == [0.6, 1.0]
    assert tree.nodes[0].value_obs == [0.2, 0.6, 1.0]
    assert tree.nodes[0].gen_obs == [0.6] and tree.nodes[0].cont_obs == [1.0]
    assert tree.nodes[1].value_obs == [0.6, 1.0] and tree.nodes[1].gen_obs == [1.0] and tree.nodes[1].cont_obs == []
    assert tree.nodes[2].value_obs == [1.0]


def test_descends_to_the_clearly_better_child_when_cont_wins():
    policy = ABMCTSA()
    tree = ABMCTSTree(agents=("a",))
    for score in (0.0, 1.0):
        policy.tell(tree, Expansion(ROOT, "a"), score)
    # make CONT at the root look much better than GEN
    tree.root.gen_obs[:] = [0.0] * 30
    tree.root.cont_obs[:] = [1.0] * 30
    tree.nodes[0].value_obs[:] = [0.0] * 30
    tree.nodes[1].value_obs[:] = [1.0] * 30
    rng = np.random.default_rng(1)
    picks = [policy.ask(tree, rng).parent for _ in range(200)]
    assert picks.count(1) > 190  # node 1 has no children: GEN under it


def test_ties_go_to_gen():
    tree = ABMCTSTree(agents=("a",))
    ABMCTSA().tell(tree, Expansion(ROOT, "a"), 0.5)

    class Fixed:
        def gamma(self, shape):
            return 1.0

        def normal(self, m, s):
            return 0.0

    assert ABMCTSA().ask(tree, Fixed()).parent == ROOT


def test_single_agent_reduces_to_single_agent_ab_mcts():
    """With one agent the agent draw consumes no randomness, so the tree equals a run with no agent choice."""
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    policy = ABMCTSA()
    t1 = ABMCTSTree(agents=("solo",))
    t2 = ABMCTSTree(agents=("solo",))
    scores = np.random.default_rng(9).random(12)
    for s in scores:
        e1 = policy.ask(t1, rng1)
        policy.tell(t1, e1, float(s))
        node, nid = t2.root, ROOT  # the same selection, written out without agents
        while node.children:
            if thompson_draw(node.gen_obs, policy.prior, rng2) >= thompson_draw(node.cont_obs, policy.prior, rng2):
                break
            draws = [thompson_draw(t2.nodes[c].value_obs, policy.prior, rng2) for c in node.children]
            nid = node.children[int(np.argmax(draws))]
            node = t2.nodes[nid]
        assert e1 == Expansion(nid, "solo")
        policy.tell(t2, Expansion(nid, "solo"), float(s))
    assert all(n.agent == "solo" for n in t1.nodes)


def test_an_agent_that_always_scores_one_is_chosen_more_often():
    policy = ABMCTSA()
    counts = {"good": 0, "bad": 0}
    for seed in range(20):
        tree = ABMCTSTree(agents=("bad", "good"))
        rng = np.random.default_rng(seed)
        for _ in range(16):
            e = policy.ask(tree, rng)
            counts[e.agent] += 1
            policy.tell(tree, e, 1.0 if e.agent == "good" else 0.0)
    assert counts["good"] > 3 * counts["bad"]


def test_seeded_search_is_reproducible():
    def run(seed):
        tree, rng, policy = ABMCTSTree(agents=("a", "b")), np.random.default_rng(seed), ABMCTSA(Prior(dist="beta"))
        for i in range(10):
            e = policy.ask(tree, rng)
            policy.tell(tree, e, (i % 3) / 2)
        return [(n.parent, n.agent) for n in tree.nodes]

    assert run(3) == run(3) and run(3) != run(4)


def test_depth_decay_scales_gen_observations():
    d = DepthDecay(gamma0=0.98, step=0.02, gamma_min=0.8)
    assert d.factor(1, 0) == 1.0 and d.factor(1, 2) == pytest.approx(0.98**2)
    assert d.factor(3, 1) == pytest.approx(0.94) and d.factor(50, 1) == 0.8
    policy = ABMCTSA(depth_decay=d)
    tree = ABMCTSTree(agents=("a",))
    policy.tell(tree, Expansion(ROOT, "a"), 1.0)
    policy.tell(tree, Expansion(ROOT, "a"), 1.0)
    assert tree.root.gen_obs == pytest.approx([1.0, 0.98])
    assert tree.agent_scores["a"] == [1.0, 1.0]  # only GEN is discounted


def test_beta_rejects_scores_outside_unit_interval():
    with pytest.raises(ValueError):
        ABMCTSA(Prior(dist="beta")).tell(ABMCTSTree(agents=("a",)), Expansion(ROOT, "a"), 1.5)
