"""The draft interface: a `Drafter` proposes gamma tokens per row with the distributions they
were drawn from, inside the jitted speculative loop (docs/design.md §6). The loop owns this interface; the
drafts in speculative/drafts/ implement it.

Exactness needs one thing of a draft: every proposed token x_i is drawn from
`sampling.process_logits(logits_i, config.sampling)`, and `logits_i` is returned with it, so the
rejection rule can compare the target's p with exactly that q. Any q is exact; a better q only
raises the acceptance rate. A draft that proposes a fixed token returns logits that are 0 there
and -inf elsewhere (a one-hot q), and a draft that cannot guess may still propose anything valid.

A drafter is a frozen, hashable object (a static `jax.jit` argument) holding only static
configuration. Arrays it needs (model weights, n-gram tables) are its `params`, a pytree passed
next to it, and what it carries between rounds is its `state`, a pytree it builds in `init`. Each
round the loop asks for proposals with one `DraftRequest` (the committed text, a key, the sampling
config, gamma or a tree shape). Shapes are static: B rows, G = gamma, V = vocabulary.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import flax
import jax
import jax.numpy as jnp

from speculative.decoding.sampling import SamplingConfig, process_logits
from speculative.decoding.tree import TreeShape


@flax.struct.dataclass
class DraftContext:
    """What the loop tells a drafter each round: the committed text of every row.

    pos: [B] position of `last`, the newest committed token (not yet fed to any model this round).
    last: [B] that token; prev: [B] the committed token before it (`last` itself at position 0).
    tokens: [B, T] generated tokens, valid up to `lengths` [B] (later slots hold stale values).
    prompt: [B, P] decoder-only prompts, or the encoder inputs of an encoder-decoder (0 = pad).
    prompt_lengths: [B] valid prompt tokens per row.
    done: [B] rows that have finished (their proposals are ignored).
    budget: [B] tokens each row wants this round (1..gamma; gamma unless a gamma policy adapts it).
    min_confidence: static; > 0 asks a row to stop after a proposal whose top draft probability is
      below it (`draft_confidence`). The loop enforces both limits itself; a drafter may use them
      to stop proposing early.
    adaptive: static; False when every row wants all gamma tokens (the fixed policy).
    """

    pos: jax.Array
    last: jax.Array
    prev: jax.Array
    tokens: jax.Array
    lengths: jax.Array
    prompt: jax.Array
    prompt_lengths: jax.Array
    done: jax.Array
    budget: jax.Array
    min_confidence: float = flax.struct.field(pytree_node=False, default=0.0)
    adaptive: bool = flax.struct.field(pytree_node=False, default=False)

    def history(self) -> tuple[jax.Array, jax.Array]:
        """Each row's whole committed text, left-aligned: (ids [B, P + T], length [B]).

        Decoder-only rows are prompt + generated tokens, so the text ends with `last`. For an
        encoder-decoder the prompt is the source text, which a lookup draft may copy from.
        """
        width = self.prompt.shape[1]
        ids = jnp.concatenate([self.prompt, self.tokens], axis=1)
        # Shift each row's generated tokens left onto the end of its prompt.
        index = jnp.arange(ids.shape[1])[None, :]
        gather = jnp.where(
            index < self.prompt_lengths[:, None],
            index,
            index - self.prompt_lengths[:, None] + width,
        )
        ids = jnp.take_along_axis(ids, jnp.clip(gather, 0, ids.shape[1] - 1), axis=1)
        length = self.prompt_lengths + self.lengths
        return jnp.where(index < length[:, None], ids, 0), length


@flax.struct.dataclass
class DraftRequest:
    """What one round asks of a drafter: a chain of gamma proposals (`Drafter.propose`) or the
    nodes of a token tree (`Drafter.propose_tree`).

    context: the committed text of every row (`DraftContext`).
    rng: the round's draft key (a drafter splits it as it likes; same key, same proposals).
    sampling: static; how logits become q (`sampling.process_logits`).
    gamma: static; G, the proposals per row of a chain (a tree's depth when `tree` is given).
    tree: static; the `TreeShape` that `propose_tree` grows, None for a chain.
    """

    context: DraftContext
    rng: jax.Array
    sampling: SamplingConfig = flax.struct.field(pytree_node=False)
    gamma: int = flax.struct.field(pytree_node=False)
    tree: TreeShape | None = flax.struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        # a tree's depth is its gamma; a request that says two different things is a caller's bug
        if self.tree is not None and self.gamma != self.tree.depth:
            raise ValueError(f"gamma {self.gamma} is not the tree's depth {self.tree.depth}")


def draft_confidence(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """[..., V] draft logits -> [...] max_x q(x), the draft's confidence in its best token.

    q as sampled (temperature, top-k, top-p); at temperature 0, where q is one-hot, the softmax of
    the raw logits, so that greedy drafting can still stop when the draft is unsure.
    """
    if sampling.greedy:
        return jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
    return jnp.exp(jnp.max(process_logits(logits, sampling), axis=-1))


def one_hot_logits(tokens: jax.Array, vocab_size: int) -> jax.Array:
    """[...] token ids -> [..., V] float32 logits of the one-hot distribution on them."""
    hot = jax.nn.one_hot(tokens, vocab_size, dtype=jnp.bool_)
    return jnp.where(hot, 0.0, -jnp.inf).astype(jnp.float32)


@runtime_checkable
class Drafter(Protocol):
    """What `decoding.loop.speculative_loop` needs of a draft.

    vocab_size: the vocabulary it proposes from (must equal the target's).
    exact_needs: nothing; any drafter is exact if `propose` keeps its contract.

    What a draft can do beyond `propose` is declared on its class, not guessed from the methods
    it happens to have (a misspelt method would otherwise leave it silently chain-only);
    `declaration_errors` checks a class's declarations against its methods:
    grows_trees: it implements `propose_tree` (token trees, `DecodeConfig.tree`).
    reads_target_features: it implements `observe_target` and `feature_width`.
    reported_stats: the optional `DecodeStats` fields (of `OPTIONAL_STATS`) it reports, each a
      method of that name.
    """

    vocab_size: int
    grows_trees: ClassVar[bool]
    reads_target_features: ClassVar[bool]
    reported_stats: ClassVar[tuple[str, ...]]

    def check_target(self, target: Any) -> None:
        """Raises ValueError when this draft cannot propose tokens for `target`."""
        ...

    def validate(self, batch: dict[str, jax.Array], config: Any) -> None:
        """Raises ValueError when `batch` cannot be drafted for under `config` (a DecodeConfig)."""
        ...

    def place_params(self, partitioner: Any, params: Any) -> Any:
        """params placed on the partitioner's mesh (outside jit)."""
        ...

    def init(self, params: Any, batch: dict[str, jax.Array], config: Any) -> Any:
        """The draft state before the first round (e.g. a prefilled KV cache), inside jit."""
        ...

    def propose(
        self, params: Any, state: Any, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, Any]:
        """request.gamma proposals per row: (tokens [B, G] int32, logits [B, G, V] float32 with
        tokens[:, i] ~ process_logits(logits[:, i], request.sampling), new state).

        The state is the one this drafter returned last round; `request.context` says what was
        committed since, so a drafter that ran ahead rewinds to `context.pos` here.
        """
        ...

    def constrain(self, partitioner: Any, state: Any) -> Any:
        """The state pinned to its shardings inside the loop (identity without a mesh)."""
        ...

    # Declared by grows_trees, for token trees (DecodeConfig.tree):
    #   propose_tree(params, state, request) -> (tokens [B, N] int32, log_q [B, N, V] float32,
    #     new state), the nodes of `request.tree`: node j's token drawn from exp(log_q[:, j - 1]),
    #     the distribution it was drawn from given its earlier siblings (normalised
    #     log-probabilities, not logits: a sibling drawn without replacement has q with the earlier
    #     ones removed).
    #   grows_tree(tree) -> bool: whether it can propose that shape.
    #
    # Declared by reads_target_features, for drafts that read the target's hidden states
    # (drafts/feature_head.py): feature_width (E), and
    #   observe_target(params, state, features [B, K, E], next_tokens [B, K], start [B],
    #     count [B]) -> state: the target's final hidden states of the tokens at positions
    #     start .. start + K - 1 (the first count[b] real), each with the token that followed it;
    #     called after the prefill (the prompt) and after every verify call (the accepted path).
    #   Drafts without the flag cost nothing: the loop asks the target for logits only.
    #
    # Declared in reported_stats, for drafts that may propose only some of their own
    # distribution's tokens (drafts/cross_vocab.py): outside_mass(state) -> [B, G] float32, the
    # draft's probability outside what it may propose at each of the round's proposals; the loop
    # sums it over each row's proposed positions into `DecodeStats.outside_mass`.
    #   draft_stalls(state) -> [B] bool, rows whose draft skipped this round's catch-up (its cache
    #   full); the loop counts them, while active, into `DecodeStats.draft_stalls`.
    #
    # Declared in reported_stats, for drafts whose model calls a round are not one per proposed
    # token (drafts/staged.py): model_calls(state) -> [B] int32, the draft-model calls the row's
    # last proposal took; the loop adds them to `DecodeStats.draft_calls` (else: the proposed
    # count). lookup_accepted(state) -> ([B], [B]) int32, the lookup tokens the draft model
    # scored / kept in that proposal, into `DecodeStats.lookup_proposed` / `lookup_accepted`.


# The optional per-row `DecodeStats` a drafter may report (`Drafter.reported_stats`).
OPTIONAL_STATS = ("outside_mass", "draft_stalls", "model_calls", "lookup_accepted")


class StatelessDrafter:
    """Defaults for drafts without a model: no state, replicated params, any target, chains only
    (a subclass that overrides `propose_tree` sets grows_trees), no target features, no optional
    stats."""

    vocab_size: int
    grows_trees: ClassVar[bool] = False
    reads_target_features: ClassVar[bool] = False
    reported_stats: ClassVar[tuple[str, ...]] = ()

    def check_target(self, target: Any) -> None:
        if target.vocab_size != self.vocab_size:
            raise ValueError(
                f"draft and target vocabularies differ in size: draft {self.vocab_size}, "
                f"target {target.vocab_size}"
            )

    def validate(self, batch: dict[str, jax.Array], config: Any) -> None:
        del batch
        check_tree(self, getattr(config, "tree", None))

    def grows_tree(self, tree: Any) -> bool:
        """Drafts declaring grows_trees grow trees of first children (tree widths)."""
        return self.grows_trees and tree.first_child_chain

    def propose_tree(self, params: Any, state: Any, request: DraftRequest) -> Any:
        """A draft that grows trees overrides this (and declares grows_trees)."""
        del params, state
        tree = request.tree.describe()
        raise NotImplementedError(f"draft {type(self).__name__} cannot propose a {tree}")

    def place_params(self, partitioner: Any, params: Any) -> Any:
        return jax.device_put(params, partitioner.replicated())

    def init(self, params: Any, batch: dict[str, jax.Array], config: Any) -> Any:
        del params, batch, config
        return ()

    def constrain(self, partitioner: Any, state: Any) -> Any:
        del partitioner
        return state


def check_tree(drafter: Drafter, tree: Any) -> None:
    """Raises ValueError when `drafter` cannot propose `tree` (a `TreeShape`; None: chains)."""
    if tree is not None and not drafter.grows_tree(tree):
        raise ValueError(f"draft {type(drafter).__name__} cannot propose a {tree.describe()}")


def declaration_errors(cls: type) -> list[str]:
    """What a drafter class declares (`Drafter`'s grows_trees, reads_target_features,
    reported_stats) and fails to implement, or implements and fails to declare; [] when they
    agree. A subclass may decline an inherited `propose_tree` by declaring grows_trees False."""
    name, errors = cls.__name__, []
    own_tree = "propose_tree" in vars(cls)
    implemented = getattr(cls, "propose_tree", None) not in (None, StatelessDrafter.propose_tree)
    if cls.grows_trees and not implemented:
        errors.append(f"{name} declares grows_trees but does not implement propose_tree")
    if own_tree and not cls.grows_trees:
        errors.append(f"{name} implements propose_tree but does not declare grows_trees")
    reads = all(hasattr(cls, k) for k in ("observe_target", "feature_width"))
    if cls.reads_target_features != reads:
        errors.append(
            f"{name}: reads_target_features {cls.reads_target_features}, but "
            f"observe_target and feature_width {'are' if reads else 'are not'} there"
        )
    for stat in set(OPTIONAL_STATS) | set(cls.reported_stats):
        declared, has = stat in cls.reported_stats, callable(getattr(cls, stat, None))
        if stat not in OPTIONAL_STATS or declared != has:
            errors.append(
                f"{name}: reported_stats {cls.reported_stats} disagrees with its "
                f"methods about {stat!r} (known: {OPTIONAL_STATS})"
            )
    return errors
