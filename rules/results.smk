# RESULTS.md: this run's tables, with the command, commit, date, versions and machine that
# made them, as one section of the results file (`snakemake --cores 1 results`). Sections of
# other runs already in the file are kept; re-measuring a run replaces its section.


rule results:
    input:
        unpack(get_results_inputs),
    output:
        "RESULTS.md",
    log:
        "logs/results.log",
    conda:
        "../envs/fewerpasses.yaml"
    params:
        run=results_run_name(),
        command=results_command(),
        basedir=workflow.basedir,
    script:
        "../scripts/results_file.py"
