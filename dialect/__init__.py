"""The `pw` dialect: its IRDL definition, contexts, builders and accessors."""
