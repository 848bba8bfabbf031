-- Scenario 4: a seeded global shuffle under a memory limit smaller than the data.
-- sqlfeed --memory-limit 16M --max-rows 5 -f examples/sql/04_global_shuffle.sql
-- (SHUFFLE ends a statement; --max-rows shows the first rows of each result.)
SELECT id, label FROM 'data/*.parquet' SHUFFLE SEED 42;
SELECT id, label FROM 'data/*.parquet' SHUFFLE SEED 42 EPOCH 1;
EXPLAIN ANALYZE SELECT id, caption, tokens, image_png FROM 'data/*.parquet' SHUFFLE SEED 42;
