"""Small, deterministic data sets generated on the spot (no downloads).

- :func:`make_qa_data` (notebook 09): contexts about invented people, templated questions
  whose answer is a span of the context;
- :func:`make_summarization_data` (notebook 10): reports whose key sentences are the
  summary;
- :class:`Vocab`, :func:`pad_batch`: vocabularies and padding shared by notebooks 08-10.
"""

from .qa import QAData, QAExample, make_qa_data
from .summarization import SummaryData, SummaryExample, make_summarization_data
from .translation import TranslationData, alignment, make_translation_data, translate_sentence
from .vocab import Vocab, pad_batch, tokenize

__all__ = ["Vocab", "pad_batch", "tokenize"]
__all__ += ["QAData", "QAExample", "make_qa_data"]
__all__ += ["SummaryData", "SummaryExample", "make_summarization_data"]
__all__ += ["TranslationData", "make_translation_data", "translate_sentence", "alignment"]
