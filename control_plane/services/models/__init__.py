"""A deployment's model as the control plane sees it without loading it: the deploy-time check
(`model_check.py`: would a worker accept it?) and what the API reads at the edge
(`model_meta.py`: context length, tokenizer, chat template)."""
