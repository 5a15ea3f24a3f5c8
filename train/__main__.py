from train.train import get_args_parser, main

if __name__ == "__main__":
    main(get_args_parser().parse_args())
