-- The materialized view: the seeds' example query over the streaming table.
CREATE MATERIALIZED VIEW rows_per_task AS
SELECT count(*) AS cnt, task FROM chunk_rows GROUP BY task;
