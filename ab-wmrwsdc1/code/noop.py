import nni
nni.get_next_parameter()
nni.report_final_result(1.0)
