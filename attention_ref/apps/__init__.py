"""The application models of notebooks 08-11, with their decoding and metrics.

- :mod:`.translation` (08): the encoder-decoder translator, greedy and beam search, BLEU;
- :mod:`.qa` (09): the span-extraction reader, best-span decoding, exact match;
- :mod:`.summarization` (10): the sentence scorer, sentence selection, sentence F1;
- :mod:`.language_model` (11): the GPT (:mod:`attention_ref.gpt`) on the grammar's
  sentences, its measurements (cross-entropy, agreement, sample quality) and training.

Each module has a ``train_*`` function that builds the data and model and trains it
exactly as its notebook does (``python -m attention_ref.bench apps`` runs them).
"""
