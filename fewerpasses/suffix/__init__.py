"""Suffix drafting: drafts from a suffix trie over the prompt and the output so far (and, with
memory across prompts, over the model's answers to the set's other prompts), continuations
ranked by how often they followed, run on prompt lookup's loop and cost gate."""
