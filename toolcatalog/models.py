# Models arrive with the tool-catalog issue (TD-1 … TD-10).
