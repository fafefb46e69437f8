"""Everything a job leaves behind: output directories local or remote (`storage`), their lock
(`store_lock`), chunked result files (`chunk_store`), the jobs' file conventions (`job_io`), run
provenance (`provenance`), metric summaries (`summaries`) and log set-up (`logs`)."""
