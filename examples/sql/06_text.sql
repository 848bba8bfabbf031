-- Scenario 6: tokenization and padding in SQL (the feed pads per batch itself).
-- sqlfeed -f examples/sql/06_text.sql   (from the repository root)
SELECT caption,
       tokenize(caption, 'udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json', 16) AS ids,
       attention_mask(tokenize(caption, 'udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json', 16), 16) AS mask
FROM 'data/*.parquet' LIMIT 3;
